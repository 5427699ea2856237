"""Inputs for each rank and the numpy reference results of each collective,
with the comparison the Chorus numerics allow.

Integers are exact (sums and products wrap, avg truncates toward zero);
f32 and f64 are compared with a small tolerance, since ranks may combine in
any order. f16 and bf16 results must be within 2 ulp of the double-precision
reference: that holds both for combining in 16 bits step by step and for
accumulating in f32 and rounding once, so the inputs are chosen so that no
partial result is much larger than the final one (positive values for sum,
prod and avg).
"""

from typing import List, Optional, Sequence

import numpy as np

import chorus

REDUCING = ("all_reduce", "reduce", "reduce_scatter")
ROOTED = ("reduce", "broadcast", "gather", "scatter")
# Kinds whose input holds world_size blocks along its first axis.
BLOCKED = ("reduce_scatter", "scatter", "all_to_all")
OPS = ("sum", "prod", "min", "max", "avg")
KINDS = ("all_reduce", "reduce", "broadcast", "all_gather", "reduce_scatter",
         "gather", "scatter", "all_to_all")


def storage(dtype: str) -> np.dtype:
    """The numpy dtype holding a Chorus dtype's elements (uint16 for bf16)."""
    return np.dtype(np.uint16) if dtype == "bf16" else np.dtype(
        {"f16": "float16", "f32": "float32", "f64": "float64", "i8": "int8",
         "u8": "uint8", "i32": "int32", "i64": "int64", "u32": "uint32",
         "u64": "uint64"}[dtype])


def _values(dtype: str, op: str, shape: Sequence[int],
            rng: np.random.Generator) -> np.ndarray:
    """Random values of `dtype` suited to `op` (see the module comment)."""
    if dtype in ("f16", "bf16", "f32", "f64"):
        if op in ("sum", "avg", "prod") and dtype in ("f16", "bf16"):
            values = rng.uniform(0.5, 2.0, size=shape)
        elif op == "prod":
            values = rng.uniform(0.5, 2.0, size=shape)
        else:
            values = rng.uniform(-4.0, 4.0, size=shape)
        if dtype == "bf16":
            return chorus.f32_to_bf16(values.astype(np.float32))
        return values.astype(storage(dtype))
    info = np.iinfo(storage(dtype))
    if op == "prod":
        low, high = (-3, 3) if info.min < 0 else (0, 3)
        return rng.integers(low, high + 1, size=shape).astype(storage(dtype))
    # Large enough to catch a float round trip, small enough that three
    # ranks' sum does not wrap.
    if info.bits >= 32:
        base = 1 << (info.bits - 3)
        values = rng.integers(0, 1000, size=shape) + base
        if info.min < 0:
            values = np.where(rng.random(size=shape) < 0.5, -values, values)
        return values.astype(storage(dtype))
    low, high = (-40, 40) if info.min < 0 else (0, 80)
    return rng.integers(low, high + 1, size=shape).astype(storage(dtype))


def rank_input(kind: str, dtype: str, op: str, world: int, rank: int,
               count: int, seed: int = 0) -> np.ndarray:
    """The input rank `rank` passes: shape (count,), or (world, count) for
    the kinds whose input holds a block per rank.
    """
    rng = np.random.default_rng([seed, rank, count, KINDS.index(kind)])
    shape = (world, count) if kind in BLOCKED else (count,)
    return _values(dtype, op, shape, rng)


def _as_float(values: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bf16":
        return chorus.bf16_to_f32(values).astype(np.float64)
    return values.astype(np.float64)


def combine(inputs: List[np.ndarray], dtype: str, op: str) -> np.ndarray:
    """The reference of reducing `inputs` with `op`: float64 for floating
    dtypes (to compare with `close`), the dtype itself for integers.
    """
    world = len(inputs)
    if dtype in ("f16", "bf16", "f32", "f64"):
        stacked = np.stack([_as_float(x, dtype) for x in inputs])
        return {"sum": lambda: stacked.sum(axis=0),
                "prod": lambda: stacked.prod(axis=0),
                "min": lambda: stacked.min(axis=0),
                "max": lambda: stacked.max(axis=0),
                "avg": lambda: stacked.sum(axis=0) / world}[op]()
    t = storage(dtype)
    stacked = np.stack(inputs)
    if op == "sum":
        return stacked.sum(axis=0, dtype=t)
    if op == "prod":
        return stacked.prod(axis=0, dtype=t)
    if op == "min":
        return stacked.min(axis=0)
    if op == "max":
        return stacked.max(axis=0)
    wide = np.dtype(np.int64) if t.kind == "i" else np.dtype(np.uint64)
    total = stacked.astype(wide).sum(axis=0, dtype=wide)
    if t.kind == "i":
        quotient = np.abs(total) // world * np.sign(total)
    else:
        quotient = total // world
    return quotient.astype(t)


def _ulp(reference: np.ndarray, dtype: str) -> np.ndarray:
    mantissa, smallest = {"f16": (10, 2.0 ** -24), "bf16": (7, 2.0 ** -133)
                          }[dtype]
    magnitude = np.abs(reference)
    exponent = np.floor(np.log2(np.where(magnitude > 0, magnitude, 1.0)))
    return np.maximum(2.0 ** (exponent - mantissa), smallest)


def check_close(actual: np.ndarray, reference: np.ndarray, dtype: str,
                op: Optional[str]) -> None:
    """Asserts that a result matches its reference as Chorus promises; `op`
    is None for kinds that only move data.
    """
    assert actual.dtype == storage(dtype), (actual.dtype, dtype)
    assert actual.shape == reference.shape, (actual.shape, reference.shape)
    if op is None or dtype not in ("f16", "bf16", "f32", "f64"):
        np.testing.assert_array_equal(actual, reference)  # bit for bit
        return
    got = _as_float(actual, dtype)
    if op in ("min", "max"):  # selected, never rounded
        np.testing.assert_array_equal(got, reference)
        return
    if dtype in ("f16", "bf16"):
        error = np.abs(got - reference)
        limit = 2 * _ulp(reference, dtype)
        worst = int(np.argmax(error - limit)) if error.size else 0
        assert np.all(error <= limit), (
            f"{dtype} {op}: {got.reshape(-1)[worst]} vs reference "
            f"{reference.reshape(-1)[worst]} is more than 2 ulp off")
        return
    rtol, atol = (1e-6, 1e-5) if dtype == "f32" else (1e-13, 1e-12)
    np.testing.assert_allclose(got, reference, rtol=rtol, atol=atol)


def expected(kind: str, inputs: List[np.ndarray], dtype: str, op: str,
             root: int, rank: int) -> Optional[np.ndarray]:
    """What `rank` gets from `kind` given every rank's input (None where
    it gets nothing). Reductions of floats are float64 (see check_close).
    """
    if kind == "all_reduce":
        return combine(inputs, dtype, op)
    if kind == "reduce":
        return combine(inputs, dtype, op) if rank == root else None
    if kind == "broadcast":
        return inputs[root]
    if kind == "all_gather":
        return np.stack(inputs)
    if kind == "reduce_scatter":
        return combine(inputs, dtype, op)[rank]
    if kind == "gather":
        return np.stack(inputs) if rank == root else None
    if kind == "scatter":
        return inputs[root][rank]
    if kind == "all_to_all":
        return np.stack([x[rank] for x in inputs])
    raise ValueError(kind)


def ramp(count: int, rank: int) -> np.ndarray:
    """count f32 values (i % 1000) + rank: small integers, so sums are
    exact.
    """
    x = np.arange(count, dtype=np.int32)
    np.remainder(x, 1000, out=x)
    out = x.astype(np.float32)
    out += rank
    return out


def check_ramp_sums(results: Sequence[np.ndarray], count: int,
                    world: int) -> None:
    """Asserts that every result is the all_reduce sum of ramp(count, r)
    over `world` ranks: a few elements, and the whole sum in exact
    integers.
    """
    i = np.array([0, 1, 999, 1000, 12345, count // 2, count - 1])
    i = i[i < count]
    ranks = world * (world - 1) // 2
    want_at = world * (i % 1000).astype(np.float32) + ranks
    whole, part = divmod(count, 1000)
    want_sum = world * (whole * 999 * 1000 // 2 + part * (part - 1) // 2) + \
        ranks * count
    for r, result in enumerate(results):
        assert result.shape == (count,) and result.dtype == np.float32
        assert np.array_equal(result[i], want_at), f"rank {r}"
        assert int(result.sum(dtype=np.float64)) == want_sum, f"rank {r}"
