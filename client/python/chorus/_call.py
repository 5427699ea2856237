"""One collective call as a communicator runs it: what it sends, what it
expects back, and how (blocking or not, deadline, forced plan and device).

A Communicator's public method checks its arguments and makes a Call;
check() finishes it (its deadline, its request's prefix, its output array),
raising InvalidArgument before the call takes a number. One call is made
unchecked: a blocking all_reduce with default options (Call.all_reduce()),
which an embedded rank hands to its extension as it is (the route
AllReduceHere checks it in C); every other route checks it first.

Thread safety: a Call belongs to the thread that made it, until its route
hands it to whichever thread settles it.
"""

import math
from typing import Any, Optional, Tuple

import numpy as np

from chorus import _arrays, _dtypes
from chorus._arrays import Buffer
from chorus._wire import Prefixes

__all__ = ["Call", "check"]


class Call:
    """What one collective sends and expects back, and how it runs.

    Attributes:
        kind, dtype, count, op, root: the call's spec (dtype a Chorus name;
            None for a barrier).
        data: this rank's input as a C-contiguous array, or None.
        out_shape: the shape of this rank's output; None when it gets none.
        out_dtype: the numpy dtype of the output's elements.
        out: the caller's `out`, as given.
        target: `out` as a writable array of the output (after check()).
        async_op, timeout, algorithm, device: as the caller gave them;
            timeout in seconds once checked.
        prefix: the request's serialized fields but its number and data
            (after check()).
        plain: whether an embedded rank's AllReduceHere may take it as it
            is: a blocking Call.all_reduce() with default options that
            nothing checked yet (nor AllReduceHere left).
        unchecked: True for Call.all_reduce() until check() read its input.
        raw: that input, as the caller gave it (then None).
        place: where a call through shared memory has its input and output
            (a chorus._shared.Place), once choose() found one.
        out_bytes: output_bytes(), once check() counted them.
    """

    __slots__ = ("kind", "dtype", "count", "op", "root", "data", "out_shape",
                 "out_dtype", "out", "target", "async_op", "timeout",
                 "algorithm", "device", "prefix", "plain", "unchecked", "raw",
                 "place", "out_bytes")

    def __init__(self, kind: str, dtype: Optional[str], count: int,
                 op: Any = "", root: int = 0,
                 data: Optional[np.ndarray] = None,
                 out_shape: Optional[Tuple[int, ...]] = None,
                 out: Optional[Buffer] = None, async_op: bool = False,
                 timeout: Optional[float] = None, algorithm: Any = None,
                 device: Any = None) -> None:
        """A call whose input the public method checked already, with the
        caller's `out` and options.
        """
        self.kind = kind
        self.dtype = dtype
        self.count = count
        self.op = op
        self.root = root
        self.data = data
        self.out_shape = out_shape
        self.out_dtype = None if dtype is None else _dtypes.numpy_dtype(dtype)
        self.out = out
        self.target: Optional[np.ndarray] = None
        self.async_op = async_op
        self.timeout: Any = timeout
        self.algorithm = algorithm
        self.device = device
        self.prefix = b""
        self.plain = False
        self.unchecked = False
        self.raw: Any = None
        self.place: Any = None

    @classmethod
    def all_reduce(cls, x: Buffer, op: Any, out: Optional[Buffer],
                   dtype: Any, async_op: bool, timeout: Optional[float],
                   algorithm: Any, device: Any) -> "Call":
        """An all_reduce of `x`, which check() reads (as `dtype`), with the
        caller's `out` and options.
        """
        # The spec's fields and the output wait for check(); a small
        # blocking call through an embedded worker may never need them.
        call = cls.__new__(cls)
        call.kind = "all_reduce"
        call.dtype = dtype  # as given, until check()
        call.op = op
        call.root = 0
        call.out = out
        call.async_op = async_op
        call.timeout = timeout
        call.algorithm = algorithm
        call.device = device
        call.plain = (not async_op and dtype is None and algorithm is None
                      and device is None)
        call.unchecked = True
        call.raw = x
        return call

    @property
    def data_bytes(self) -> int:
        """The bytes of this rank's input."""
        return 0 if self.data is None else self.data.nbytes

    def output_bytes(self) -> int:
        """The bytes of this rank's output."""
        if self.out_shape is None or self.out_dtype is None:
            return 0
        return math.prod(self.out_shape) * self.out_dtype.itemsize


def check(call: Call, prefixes: Prefixes, default_timeout: float) -> None:
    """Finishes `call` before it takes a number: reads Call.all_reduce()'s
    input, checks its timeout (default_timeout for None), makes its
    request's prefix and reads its `out`. Raises InvalidArgument for what
    the call cannot carry.
    """
    if call.unchecked:
        data, name = _arrays.as_array(call.raw, call.dtype, "x")
        call.plain = call.unchecked = False
        call.raw = call.target = call.place = None
        call.dtype, call.count, call.data = name, data.size, data
        call.out_shape = data.shape
        call.out_dtype = _dtypes.numpy_dtype(name)
        call.out_bytes = data.nbytes
    else:
        call.out_bytes = call.output_bytes()
    call.timeout = _arrays.check_timeout(call.timeout, default_timeout)
    call.prefix = prefixes.prefix(call.kind, call.dtype, call.count, call.op,
                                  call.root, call.algorithm, call.device)
    if call.out_shape is not None and call.out is not None:
        call.target = _arrays.as_output(
            call.out, call.dtype, call.out_bytes // call.out_dtype.itemsize)
