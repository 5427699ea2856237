"""What a collective takes: its arguments checked and its buffers seen as
numpy arrays, with no copy.

Inputs are numpy arrays, C-contiguous buffers or DLPack tensors of the ten
Chorus dtypes (bf16 as its 16-bit patterns); outputs (`out`) writable numpy
arrays or buffers. Arrays in a GPU's memory (the CUDA Array Interface) are
read as chorus._device_arrays says. Everything here raises InvalidArgument,
before a call takes its number.
"""

import math
import sys
from typing import Any, Optional, Sequence, Tuple, Union

import numpy as np

from chorus import _dtypes
from chorus._device_arrays import device_input, device_output, is_device_array
from chorus.errors import InvalidArgument

__all__ = ["Buffer", "check_timeout", "as_array", "as_output",
           "split_blocks", "shape_of"]

Buffer = Any
"""A numpy array, any object with the buffer protocol (C-contiguous), or an
object with __dlpack__ (e.g. a torch CPU tensor).
"""


def check_timeout(timeout: Optional[float], default: float) -> float:
    """Returns `timeout` in seconds (`default` for None); InvalidArgument
    for anything but a finite number of seconds > 0.
    """
    if timeout is None:
        return default
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise InvalidArgument(f"timeout must be seconds, got {timeout!r}")
    if not timeout > 0 or math.isinf(timeout):
        raise InvalidArgument(
            f"timeout must be a finite number of seconds > 0, got {timeout}")
    return float(timeout)



def as_array(x: Buffer, dtype: Optional[str], what: str
              ) -> Tuple[np.ndarray, str]:
    """Returns (a C-contiguous numpy view of x, its Chorus dtype name); for
    an array in GPU memory, a chorus._device_arrays.DeviceArray of it.

    Raises InvalidArgument for anything that cannot be sent without a copy
    or whose dtype Chorus does not have.
    """
    want = None
    if dtype is not None:
        try:
            want = _dtypes.dtype_name(dtype)
        except ValueError as e:
            raise InvalidArgument(str(e)) from None
    raw = False  # bytes of a buffer whose format says nothing of its type
    if isinstance(x, np.ndarray):
        arr = x
    elif is_device_array(x):
        return device_input(x, want, what)
    elif hasattr(x, "__dlpack__"):
        arr = _from_dlpack(x, what)
        if str(getattr(x, "dtype", "")).endswith("bfloat16") and \
                arr.dtype == np.int16:
            want = want or "bf16"
    else:
        try:
            view = memoryview(x)
        except TypeError:
            raise InvalidArgument(
                f"{what} must be a numpy array, a C-contiguous buffer or a "
                f"DLPack tensor, got {type(x).__name__}; e.g. pass "
                f"numpy.asarray({what}, dtype='float32')") from None
        if not view.c_contiguous:
            raise InvalidArgument(
                f"{what} is not C-contiguous; pass a contiguous copy "
                "(numpy.ascontiguousarray)")
        raw = view.format in ("B", "b", "c")
        arr = np.asarray(view)
    if not arr.flags.c_contiguous:
        raise InvalidArgument(
            f"{what} is not C-contiguous (strides {arr.strides} for shape "
            f"{arr.shape}); pass numpy.ascontiguousarray({what})")
    have = _dtypes.numpy_dtype_name(arr.dtype)
    if want is None:
        if have is None:
            raise InvalidArgument(
                f"{what} has dtype {arr.dtype}, which Chorus does not have; "
                f"it supports {', '.join(_dtypes.DTYPES)} (bf16 as uint16 "
                "with dtype='bf16')")
        return arr, have
    if want == have:
        return arr, want
    if want == "bf16" and arr.dtype.kind in "ui" and arr.dtype.itemsize == 2:
        return arr.view(_dtypes.numpy_dtype("bf16")), want
    if raw:
        size = _dtypes.numpy_dtype(want).itemsize
        if arr.nbytes % size:
            raise InvalidArgument(
                f"{what} has {arr.nbytes} bytes, not a whole number of "
                f"{want} elements ({size} bytes each)")
        return arr.reshape(-1).view(_dtypes.numpy_dtype(want)), want
    raise InvalidArgument(
        f"{what} holds {arr.dtype} but dtype={dtype!r} was asked for; "
        f"convert it first (e.g. {what}.astype(...)) or leave dtype out")


def _from_dlpack(x: Any, what: str) -> np.ndarray:
    """A numpy view of a DLPack tensor (a torch bfloat16 one's bits)."""
    try:
        return np.from_dlpack(x)
    except (TypeError, BufferError, RuntimeError, ValueError) as first:
        # numpy has no bfloat16: take a torch bfloat16 tensor's bits.
        if str(getattr(x, "dtype", "")).endswith("bfloat16"):
            torch = sys.modules.get("torch")
            if torch is not None and hasattr(x, "view"):
                return np.from_dlpack(x.view(torch.int16))
        raise InvalidArgument(
            f"{what} cannot be read through DLPack ({first}); Chorus takes "
            "host (CPU) memory of its ten dtypes") from None


def as_output(out: Buffer, dtype: str, size: int) -> np.ndarray:
    """Returns a writable numpy view of `out` holding `size` elements of
    `dtype` (a DeviceArray of an `out` in GPU memory), or raises
    InvalidArgument.
    """
    element = _dtypes.numpy_dtype(dtype)
    if isinstance(out, np.ndarray):
        arr = out
    elif is_device_array(out):
        return device_output(out, dtype, size)
    else:
        try:
            view = memoryview(out)
        except TypeError:
            raise InvalidArgument(
                f"out must be a writable numpy array or buffer, got "
                f"{type(out).__name__} (for a torch tensor pass "
                "out=tensor.numpy())") from None
        if view.readonly:
            raise InvalidArgument("out is read-only")
        if not view.c_contiguous:
            raise InvalidArgument("out is not C-contiguous")
        arr = np.asarray(view)
        if view.format in ("B", "b", "c"):
            if arr.nbytes != size * element.itemsize:
                raise InvalidArgument(
                    f"out has {arr.nbytes} bytes; the result takes "
                    f"{size * element.itemsize} ({size} x {dtype})")
            return arr.reshape(-1).view(element)
    if not arr.flags.writeable:
        raise InvalidArgument("out is read-only")
    if not arr.flags.c_contiguous:
        raise InvalidArgument("out is not C-contiguous")
    fits = (_dtypes.numpy_dtype_name(arr.dtype) == dtype or
            (dtype == "bf16" and arr.dtype.kind in "ui" and
             arr.dtype.itemsize == 2))
    if not fits:
        raise InvalidArgument(
            f"out holds {arr.dtype}; the result is {dtype}"
            f"{' (as uint16)' if dtype == 'bf16' else ''}")
    if arr.size != size:
        raise InvalidArgument(
            f"out has {arr.size} elements; the result has {size}")
    return arr


def split_blocks(shape: Tuple[int, ...], world: int, what: str
                  ) -> Tuple[int, ...]:
    """Returns the shape of one of `world` blocks of an array of `shape`: the
    first axis holds the blocks, (world, *block) or (world * n, *rest).
    """
    if len(shape) == 0 or shape[0] % world:
        raise InvalidArgument(
            f"{what} of shape {shape} does not split into {world} equal "
            f"blocks along its first axis; pass shape (world_size, *block) "
            f"or (world_size * n, ...)")
    if shape[0] == world and len(shape) >= 2:
        return tuple(shape[1:])
    return (shape[0] // world,) + tuple(shape[1:])


def shape_of(shape: Union[int, Sequence[int]]) -> Tuple[int, ...]:
    """Returns a shape given as an int or a sequence of ints, as a tuple;
    InvalidArgument for anything else or a negative size.
    """
    if isinstance(shape, (int, np.integer)) and not isinstance(shape, bool):
        shape = (int(shape),)
    try:
        out = tuple(int(s) for s in shape)
    except TypeError:
        raise InvalidArgument(
            f"shape must be an int or a tuple of ints, got {shape!r}"
        ) from None
    if any(s < 0 for s in out):
        raise InvalidArgument(f"shape {out} has a negative size")
    return out

