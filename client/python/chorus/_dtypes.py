"""Element types: Chorus's ten dtypes, their names and numpy equivalents."""

from typing import Any, Dict, Optional, Tuple

import numpy as np

from chorus import _names

# Chorus name -> numpy dtype holding its elements. bf16 has no numpy dtype:
# its elements travel as their 16-bit patterns (uint16).
_NUMPY: Dict[str, np.dtype] = {
    "f16": np.dtype("<f2"), "bf16": np.dtype("<u2"),
    "f32": np.dtype("<f4"), "f64": np.dtype("<f8"),
    "i8": np.dtype("i1"), "u8": np.dtype("u1"),
    "i32": np.dtype("<i4"), "i64": np.dtype("<i8"),
    "u32": np.dtype("<u4"), "u64": np.dtype("<u8"),
}
# Chorus name -> (proto enum value, numpy dtype), for the protos' dtypes
# (types.proto's DType, read from its descriptor).
_TABLE: Dict[str, Tuple[int, np.dtype]] = {
    name: (number, _NUMPY[name]) for name, number in _names.DTYPES.items()}

DTYPES: Tuple[str, ...] = tuple(_TABLE)
"""The names of the ten element types Chorus reduces and moves."""

_ALIASES: Dict[str, str] = {
    "float16": "f16", "half": "f16",
    "bfloat16": "bf16",
    "float32": "f32",
    "float64": "f64", "double": "f64",
    "int8": "i8", "uint8": "u8",
    "int32": "i32", "int64": "i64",
    "uint32": "u32", "uint64": "u64",
}

# numpy element type -> Chorus name (uint16 is never inferred as bf16).
_FROM_NUMPY: Dict[Tuple[str, int], str] = {
    ("f", 2): "f16", ("f", 4): "f32", ("f", 8): "f64",
    ("i", 1): "i8", ("u", 1): "u8",
    ("i", 4): "i32", ("i", 8): "i64",
    ("u", 4): "u32", ("u", 8): "u64",
}


def dtype_name(dtype: Any) -> str:
    """Returns the Chorus name ("f32", "bf16", ...) of a dtype given as a
    Chorus name, a numpy name ("float32", "bfloat16"), a numpy dtype or a
    numpy scalar type. Raises ValueError for any other dtype.
    """
    if isinstance(dtype, str):
        lowered = dtype.strip().lower()
        if lowered in _TABLE:
            return lowered
        if lowered in _ALIASES:
            return _ALIASES[lowered]
        raise ValueError(
            f"unknown dtype {dtype!r}; Chorus supports {', '.join(DTYPES)}")
    try:
        as_numpy = np.dtype(dtype)
    except TypeError:
        raise ValueError(
            f"unknown dtype {dtype!r}; Chorus supports {', '.join(DTYPES)}"
        ) from None
    name = numpy_dtype_name(as_numpy)
    if name is None:
        raise ValueError(
            f"numpy dtype {as_numpy} has no Chorus equivalent; Chorus "
            f"supports {', '.join(DTYPES)} (bf16 as a uint16 view with "
            "dtype='bf16')")
    return name


# numpy_dtype_name's answers by dtype.
_NAMES: Dict[np.dtype, Optional[str]] = {}


def numpy_dtype_name(dtype: np.dtype) -> Optional[str]:
    """Returns the Chorus name for a numpy dtype, or None when it has none.
    Big-endian dtypes have none: Chorus elements are little-endian.
    """
    try:
        return _NAMES[dtype]
    except KeyError:
        pass
    name = None
    if dtype.byteorder != ">" and (dtype.byteorder != "=" or
                                   np.little_endian):
        name = _FROM_NUMPY.get((dtype.kind, dtype.itemsize))
    if len(_NAMES) < 64:  # the few dtypes a program uses
        _NAMES[dtype] = name
    return name


def proto_dtype(name: str) -> int:
    """Returns the chorus.v1.DType value of a Chorus dtype name."""
    return _TABLE[name][0]


def numpy_dtype(name: str) -> np.dtype:
    """Returns the numpy dtype whose elements hold a Chorus dtype (uint16 for
    bf16).
    """
    return _TABLE[name][1]


def bf16_to_f32(bits: Any) -> np.ndarray:
    """Returns bf16 values (an array of their 16-bit patterns, as the bf16
    results of this package are) widened exactly to float32.
    """
    patterns = np.asarray(bits)
    if patterns.dtype.itemsize != 2 or patterns.dtype.kind not in "ui":
        raise ValueError(
            f"bf16 values are 16-bit patterns (uint16); got {patterns.dtype}")
    return (patterns.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(values: Any) -> np.ndarray:
    """Returns float32 values rounded to bf16 (round to nearest even; NaN
    stays NaN) as an array of 16-bit patterns (uint16).
    """
    as_f32 = np.ascontiguousarray(values, dtype=np.float32)
    bits = as_f32.view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    out = rounded.astype(np.uint16)
    nan = np.isnan(as_f32)
    out[nan] = ((bits[nan] >> 16) | 0x40).astype(np.uint16)
    return out
