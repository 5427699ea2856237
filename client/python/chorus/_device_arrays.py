"""Arrays in a GPU's memory, as the CUDA Array Interface describes them
(`__cuda_array_interface__`: CuPy and Numba arrays, torch CUDA tensors).

An embedded rank joined on a GPU (Cuda(n)) runs a collective on such arrays
through the worker's device path: the call reads the input where it is and
writes the output into `out`, ordered on the interface's `stream` (the call
waits on the GPU for the work enqueued there before, and what is enqueued
there after it sees its output). Everything here raises InvalidArgument,
before a call takes its number.
"""

import math
from typing import Any, Dict, Optional, Tuple

import numpy as np

from chorus import _dtypes
from chorus.errors import InvalidArgument

__all__ = ["DeviceArray", "is_device_array", "device_input", "device_output",
           "check_device_call"]


def is_device_array(x: Any) -> bool:
    """Whether `x` offers the CUDA Array Interface (or has it and refuses
    to give it, as torch does for bfloat16: DeviceArray then says why).
    """
    try:
        getattr(x, "__cuda_array_interface__")
    except AttributeError:  # torch's CPU tensors too
        return False
    except Exception:
        return True
    return True


class DeviceArray:
    """A C-contiguous array in a GPU's memory.

    Attributes:
        owner: the object that describes it (kept alive with it).
        pointer: its device address (0 for an empty array).
        shape, dtype, size, nbytes: as numpy's (dtype a numpy dtype).
        readonly: whether the interface says it must not be written.
        stream: the CUDA stream its producer's work is on (the interface's
            `stream`), 0 when it names none.
    """

    __slots__ = ("owner", "pointer", "shape", "dtype", "size", "nbytes",
                 "readonly", "stream")

    def __init__(self, owner: Any, what: str) -> None:
        """Reads `owner`'s __cuda_array_interface__; InvalidArgument for an
        interface Chorus cannot take (strided, masked, big-endian or of a
        dtype it does not have), naming `what`.
        """
        interface = _interface_of(owner, what)
        self.owner = owner
        self.shape: Tuple[int, ...] = tuple(int(s) for s in interface["shape"])
        try:
            self.dtype = np.dtype(interface["typestr"])
        except TypeError:
            raise InvalidArgument(
                f"{what} has typestr {interface['typestr']!r}, which numpy "
                "does not read") from None
        if self.dtype.byteorder == ">":
            raise InvalidArgument(f"{what} is big-endian; Chorus moves "
                                  "little-endian elements")
        self.size = math.prod(self.shape)
        self.nbytes = self.size * self.dtype.itemsize
        strides = interface.get("strides")
        if strides is not None and self.size > 1 and \
                tuple(strides) != _c_strides(self.shape, self.dtype.itemsize):
            raise InvalidArgument(
                f"{what} is not C-contiguous (strides {tuple(strides)} for "
                f"shape {self.shape}); pass a contiguous copy")
        if interface.get("mask") is not None:
            raise InvalidArgument(f"{what} is masked; Chorus moves every "
                                  "element")
        pointer, readonly = interface["data"]
        self.pointer = int(pointer or 0)
        self.readonly = bool(readonly)
        stream = interface.get("stream")
        self.stream = int(stream) if stream is not None else 0


def _interface_of(owner: Any, what: str) -> Dict[str, Any]:
    """`owner`'s __cuda_array_interface__, checked for the keys every
    version has; InvalidArgument when it cannot be read.
    """
    try:
        interface = owner.__cuda_array_interface__
    except Exception as e:  # the producer refuses (e.g. torch's bfloat16)
        raise InvalidArgument(
            f"{what}'s __cuda_array_interface__ cannot be read ({e})"
        ) from None
    if not isinstance(interface, dict) or not {"shape", "typestr",
                                               "data"} <= interface.keys():
        raise InvalidArgument(f"{what}'s __cuda_array_interface__ lacks "
                              "shape, typestr or data")
    return interface


def _c_strides(shape: Tuple[int, ...], itemsize: int) -> Tuple[int, ...]:
    """The strides of a C-contiguous array of `shape`."""
    strides = []
    step = itemsize
    for size in reversed(shape):
        strides.append(step)
        step *= size
    return tuple(reversed(strides))


def _fits(have: np.dtype, want: str) -> bool:
    """Whether elements of numpy dtype `have` are Chorus dtype `want`'s
    (bf16 travels as 16-bit integers).
    """
    return (_dtypes.numpy_dtype_name(have) == want or
            (want == "bf16" and have.kind in "ui" and have.itemsize == 2))


def device_input(x: Any, dtype: Optional[str], what: str
                 ) -> Tuple[DeviceArray, str]:
    """Returns (x as a DeviceArray, its Chorus dtype name), as
    chorus._arrays.as_array does for host arrays.
    """
    array = DeviceArray(x, what)
    if dtype is None:
        name = _dtypes.numpy_dtype_name(array.dtype)
        if name is None:
            raise InvalidArgument(
                f"{what} has dtype {array.dtype}, which Chorus does not "
                f"have; it supports {', '.join(_dtypes.DTYPES)}")
        return array, name
    try:
        want = _dtypes.dtype_name(dtype)
    except ValueError as e:
        raise InvalidArgument(str(e)) from None
    if not _fits(array.dtype, want):
        raise InvalidArgument(
            f"{what} holds {array.dtype} but dtype={dtype!r} was asked for")
    return array, want


def device_output(out: Any, dtype: str, size: int) -> DeviceArray:
    """Returns `out` as a writable DeviceArray of `size` elements of
    `dtype`, as chorus._arrays.as_output does for host arrays.
    """
    array = DeviceArray(out, "out")
    if array.readonly:
        raise InvalidArgument("out is read-only")
    if not _fits(array.dtype, dtype):
        raise InvalidArgument(f"out holds {array.dtype}; the result is "
                              f"{dtype}")
    if array.size != size:
        raise InvalidArgument(
            f"out has {array.size} elements; the result has {size}")
    return array


def check_device_call(data: Any, target: Any, has_output: bool,
                      runs_here: bool) -> bool:
    """Whether a checked call (its input `data`, its output array
    `target`) runs on device memory. Raises InvalidArgument for one that
    mixes host and device arrays, that has an output but no `out`, or
    whose rank cannot run it (not an embedded one, `runs_here` False).
    """
    on_device = isinstance(data, DeviceArray) or \
        isinstance(target, DeviceArray)
    if not on_device:
        return False
    if not runs_here:
        raise InvalidArgument(
            "arrays in GPU memory (__cuda_array_interface__) are taken by "
            "ranks that embed the worker runtime (chorus.embedded); a worker "
            "daemon's ranks pass host arrays")
    if (data is not None and not isinstance(data, DeviceArray)) or \
            (target is not None and not isinstance(target, DeviceArray)):
        raise InvalidArgument(
            "the input and out of one call are both in GPU memory or both "
            "in host memory")
    if has_output and target is None:
        raise InvalidArgument(
            "a call on arrays in GPU memory writes its output into out=, "
            "an array in that GPU's memory: pass one")
    return True
