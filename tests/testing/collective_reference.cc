#include "tests/testing/collective_reference.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/dtype.h"

namespace chorus::test {
namespace {

// ---------------------------------------------------------------------------
// Element encoding. Integers travel as their low bytes (little endian, as on
// every machine Chorus runs on); floats through the helpers below, which
// encode only values the type holds exactly (inputs are chosen that way).

bool IsSignedInteger(DType dtype) {
  return dtype == DType::kI8 || dtype == DType::kI32 || dtype == DType::kI64;
}

int Bits(DType dtype) { return static_cast<int>(DTypeSize(dtype)) * 8; }

uint64_t Mask(DType dtype) {
  const int bits = Bits(dtype);
  return bits == 64 ? ~uint64_t{0} : (uint64_t{1} << bits) - 1;
}

uint64_t LoadRaw(DType dtype, const char* p) {
  uint64_t v = 0;
  std::memcpy(&v, p, DTypeSize(dtype));
  return v;
}

void StoreRaw(DType dtype, char* p, uint64_t v) {
  std::memcpy(p, &v, DTypeSize(dtype));
}

// Sign-extends the low Bits(dtype) bits of `raw`.
int64_t AsSigned(DType dtype, uint64_t raw) {
  const int bits = Bits(dtype);
  if (bits == 64) return static_cast<int64_t>(raw);
  const uint64_t sign = uint64_t{1} << (bits - 1);
  return static_cast<int64_t>((raw ^ sign) - sign);
}

uint32_t FloatBitsOf(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

float FloatOfBits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

long double HalfToValue(uint16_t h) {
  const bool negative = (h & 0x8000) != 0;
  const int exponent = (h >> 10) & 0x1f;
  const int mantissa = h & 0x3ff;
  long double v;
  if (exponent == 0x1f) {
    v = mantissa == 0 ? std::numeric_limits<long double>::infinity()
                      : std::numeric_limits<long double>::quiet_NaN();
  } else if (exponent == 0) {
    v = std::ldexp(static_cast<long double>(mantissa), -24);
  } else {
    v = std::ldexp(static_cast<long double>(mantissa + 1024), exponent - 25);
  }
  return negative ? -v : v;
}

// Encodes a value f16 holds exactly (or an infinity, or NaN).
uint16_t ValueToHalf(long double v) {
  const uint16_t sign = std::signbit(v) ? 0x8000 : 0;
  if (std::isnan(v)) return sign | 0x7e00;
  if (std::isinf(v)) return sign | 0x7c00;
  const long double a = std::fabs(v);
  if (a == 0) return sign;
  uint16_t bits;
  if (a < std::ldexp(1.0L, -14)) {
    bits = static_cast<uint16_t>(std::ldexp(a, 24));
  } else {
    int e;
    const long double m = std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
    bits = static_cast<uint16_t>(((e + 14) << 10) |
                                 static_cast<int>(std::ldexp(m, 11) - 1024));
  }
  if (HalfToValue(bits) != a) {
    ADD_FAILURE() << "harness bug: " << static_cast<double>(v)
                  << " is not an f16 value";
  }
  return sign | bits;
}

long double BFloat16ToValue(uint16_t b) {
  return FloatOfBits(static_cast<uint32_t>(b) << 16);
}

uint16_t ValueToBFloat16(long double v) {
  if (std::isnan(v)) return std::signbit(v) ? 0xffc0 : 0x7fc0;
  const uint32_t bits = FloatBitsOf(static_cast<float>(v));
  if ((bits & 0xffff) != 0 ||
      static_cast<long double>(static_cast<float>(v)) != v) {
    ADD_FAILURE() << "harness bug: " << static_cast<double>(v)
                  << " is not a bf16 value";
  }
  return static_cast<uint16_t>(bits >> 16);
}

long double LoadFloat(DType dtype, const char* p) {
  switch (dtype) {
    case DType::kF16:
      return HalfToValue(static_cast<uint16_t>(LoadRaw(dtype, p)));
    case DType::kBF16:
      return BFloat16ToValue(static_cast<uint16_t>(LoadRaw(dtype, p)));
    case DType::kF32: {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
    default: {
      double d;
      std::memcpy(&d, p, 8);
      return d;
    }
  }
}

void StoreFloat(DType dtype, char* p, long double v) {
  switch (dtype) {
    case DType::kF16:
      StoreRaw(dtype, p, ValueToHalf(v));
      break;
    case DType::kBF16:
      StoreRaw(dtype, p, ValueToBFloat16(v));
      break;
    case DType::kF32: {
      const float f = static_cast<float>(v);
      std::memcpy(p, &f, 4);
      break;
    }
    default: {
      const double d = static_cast<double>(v);
      std::memcpy(p, &d, 8);
      break;
    }
  }
}

// Bits of the significand (with the implicit one) and machine epsilon.
int Precision(DType dtype) {
  switch (dtype) {
    case DType::kF16:
      return 11;
    case DType::kBF16:
      return 8;
    case DType::kF32:
      return 24;
    default:
      return 53;
  }
}

long double Epsilon(DType dtype) {
  return std::ldexp(1.0L, 1 - Precision(dtype));
}

// Smallest positive (subnormal) value: the floor of every tolerance.
long double Tiny(DType dtype) {
  switch (dtype) {
    case DType::kF16:
      return std::ldexp(1.0L, -24);
    case DType::kBF16:
      return std::ldexp(1.0L, -133);
    case DType::kF32:
      return std::ldexp(1.0L, -149);
    default:
      return std::ldexp(1.0L, -1074);
  }
}

// ---------------------------------------------------------------------------
// Deterministic pseudo-random values.

uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t Random(uint64_t seed, int rank, uint64_t index, uint64_t salt) {
  return Mix(Mix(Mix(seed * 0x100000001b3ull + salt) ^ rank) ^ index);
}

bool ReducingKind(CollectiveKind kind) { return KindReduces(kind); }

// Float value of element `index` of rank `rank` for a reducing case.
long double FloatInput(const CollectiveCase& c, int world, int rank,
                       uint64_t index) {
  const DType dtype = c.spec.dtype;
  const ReduceOp op = c.spec.op;
  const uint64_t r = Random(c.seed, rank, index, 17);
  if (c.values == Values::kExact) {
    if (op == ReduceOp::kProd) {
      static constexpr long double kFactors[] = {-2, -1, -0.5, 0.5, 1, 2};
      return kFactors[r % 6];
    }
    if (op == ReduceOp::kMin || op == ReduceOp::kMax) {
      // Block-relative index, so every block of reduce_scatter has them.
      const uint64_t i = index % std::max<uint64_t>(1, c.spec.count);
      if (i == 0) return rank % 2 == 0 ? 0.0L : -0.0L;
      if (i == 1 && rank == world - 1) {
        return std::numeric_limits<long double>::quiet_NaN();
      }
      if (i == 2 && rank == 0) {
        return std::numeric_limits<long double>::infinity();
      }
      if (i == 3 && rank == world / 2) {
        return -std::numeric_limits<long double>::infinity();
      }
    }
    return static_cast<long double>(static_cast<int>(r % 17) - 8);
  }
  // Full-precision significands over a few binades.
  const int p = Precision(dtype);
  const uint64_t significand =
      (uint64_t{1} << (p - 1)) | (r & ((uint64_t{1} << (p - 1)) - 1));
  const int spread = op == ReduceOp::kProd ? 2 : 7;
  const int exponent = static_cast<int>((r >> 56) % spread);
  const long double magnitude =
      std::ldexp(static_cast<long double>(significand), -(p - 1) - exponent);
  return (Random(c.seed, rank, index, 23) & 1) ? -magnitude : magnitude;
}

// Integer bits of element `index` of rank `rank` for a reducing case.
uint64_t IntegerInput(const CollectiveCase& c, int rank, uint64_t index) {
  const DType dtype = c.spec.dtype;
  const uint64_t i = index % std::max<uint64_t>(1, c.spec.count);
  const uint64_t max = IsSignedInteger(dtype) ? Mask(dtype) >> 1 : Mask(dtype);
  switch (c.spec.op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      // Every rank at the maximum: the sum wraps for world >= 2.
      if (i == 0) return max;
      if (i == 1) return rank % 2 == 0 ? max : 1;
      break;
    case ReduceOp::kProd:
      // 2^(bits/2) on every rank: the product wraps to 0 for world >= 2.
      if (i == 0) return uint64_t{1} << (Bits(dtype) / 2);
      // -1 (all ones) everywhere: +-1 in signed types, wraps in unsigned.
      if (i == 1) return Mask(dtype);
      // Small odd factors: an exact product unless it overflows.
      if (i == 2) return 3 + 2 * static_cast<uint64_t>(rank);
      break;
    default:
      if (i == 0) return rank == 0 ? max : rank;
      if (i == 1) return rank == 0 ? ~uint64_t{0} & Mask(dtype) : 0;
      break;
  }
  return Random(c.seed, rank, index, 29) & Mask(dtype);
}

// Fills `count` elements at `out` for rank `rank`, element indices starting
// at `first` (blocks of world*count inputs continue the numbering).
void FillElements(const CollectiveCase& c, int world, int rank, uint64_t first,
                  uint64_t count, char* out) {
  const DType dtype = c.spec.dtype;
  const size_t size = DTypeSize(dtype);
  for (uint64_t k = 0; k < count; ++k) {
    char* p = out + k * size;
    const uint64_t index = first + k;
    if (!ReducingKind(c.spec.kind)) {
      // Data movement: arbitrary bit patterns (NaN payloads included) that
      // must arrive unchanged.
      StoreRaw(dtype, p, Random(c.seed, rank, index, 31));
    } else if (IsFloatDType(dtype)) {
      StoreFloat(dtype, p, FloatInput(c, world, rank, index));
    } else {
      StoreRaw(dtype, p, IntegerInput(c, rank, index));
    }
  }
}

// ---------------------------------------------------------------------------
// Reference reductions.

struct FloatReduction {
  long double value;
  long double tolerance;
};

bool IsHalfDType(DType dtype) {
  return dtype == DType::kF16 || dtype == DType::kBF16;
}

// The spacing of `dtype`'s values at `v` (its unit in the last place).
long double Ulp(DType dtype, long double v) {
  const int p = Precision(dtype);
  const int min_exponent = dtype == DType::kF16    ? -14
                           : dtype == DType::kBF16 ? -126
                           : dtype == DType::kF32  ? -126
                                                   : -1022;
  int exponent = min_exponent;
  if (v != 0 && std::isfinite(v)) {
    exponent = std::max(min_exponent, std::ilogb(v));
  }
  return std::ldexp(1.0L, exponent - (p - 1));
}

// `v` rounded once to the nearest value of `dtype` (ties to even), ignoring
// overflow (the test values stay far below it).
long double RoundTo(DType dtype, long double v) {
  if (v == 0 || !std::isfinite(v)) return v;
  const long double ulp = Ulp(dtype, v);
  return std::nearbyint(v / ulp) * ulp;
}

// f16 and bf16 reductions combine in f32 and round once: the result lies
// within one 16-bit ulp of the exact value rounded once, plus what the f32
// partials can lose (`f32_error`).
FloatReduction HalfReduction(DType dtype, long double exact,
                             long double f32_error) {
  const long double want = RoundTo(dtype, exact);
  return {want, Ulp(dtype, want) + f32_error};
}

FloatReduction ReduceFloats(const CollectiveCase& c, int world,
                            const std::vector<long double>& x) {
  const DType dtype = c.spec.dtype;
  const long double eps = Epsilon(dtype);
  const long double tiny = Tiny(dtype);
  const bool exact = c.values == Values::kExact;
  const bool half = IsHalfDType(dtype);
  const long double f32_eps = Epsilon(DType::kF32);
  long double sum = 0;
  long double magnitude = 0;
  long double product = 1;
  for (long double v : x) {
    sum += v;
    magnitude += std::fabs(v);
    product *= v;
  }
  switch (c.spec.op) {
    case ReduceOp::kSum:
      if (half) {
        return HalfReduction(dtype, sum,
                             exact ? 0 : world * f32_eps * magnitude);
      }
      return {sum, exact ? 0 : world * eps * magnitude + world * tiny};
    case ReduceOp::kProd:
      if (half) {
        return HalfReduction(dtype, product,
                             exact ? 0 : world * f32_eps * std::fabs(product));
      }
      return {product,
              exact ? 0 : world * eps * std::fabs(product) + world * tiny};
    case ReduceOp::kAvg: {
      const long double avg = sum / world;
      if (half) {
        // The f32 sum as above, then one f32 division.
        return HalfReduction(
            dtype, avg, exact ? 0 : f32_eps * (magnitude + std::fabs(avg)));
      }
      // The quotient rounds once; the sum as above.
      const long double sum_error =
          exact ? 0 : world * eps * magnitude + world * tiny;
      return {avg, sum_error / world + 2 * eps * std::fabs(avg) + tiny};
    }
    case ReduceOp::kMin:
    case ReduceOp::kMax: {
      const bool is_min = c.spec.op == ReduceOp::kMin;
      long double best = x[0];
      for (long double v : x) {
        if (std::isnan(v) || std::isnan(best)) {
          best = std::numeric_limits<long double>::quiet_NaN();
          continue;
        }
        if (v == best) {
          // -0 wins for min, +0 for max.
          if (is_min ? std::signbit(v) : !std::signbit(v)) best = v;
        } else if (is_min ? v < best : v > best) {
          best = v;
        }
      }
      return {best, 0};
    }
    default:
      return {0, 0};
  }
}

uint64_t ReduceIntegers(const CollectiveCase& c, int world,
                        const std::vector<uint64_t>& x) {
  const DType dtype = c.spec.dtype;
  const uint64_t mask = Mask(dtype);
  const bool is_signed = IsSignedInteger(dtype);
  uint64_t acc = x[0];
  for (size_t r = 1; r < x.size(); ++r) {
    const uint64_t v = x[r];
    switch (c.spec.op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg:
        acc = (acc + v) & mask;
        break;
      case ReduceOp::kProd:
        acc = (acc * v) & mask;
        break;
      case ReduceOp::kMin:
      case ReduceOp::kMax: {
        const bool less =
            is_signed ? AsSigned(dtype, v) < AsSigned(dtype, acc) : v < acc;
        const bool greater =
            is_signed ? AsSigned(dtype, v) > AsSigned(dtype, acc) : v > acc;
        if (c.spec.op == ReduceOp::kMin ? less : greater) acc = v;
        break;
      }
      default:
        break;
    }
  }
  if (c.spec.op == ReduceOp::kAvg) {
    // The sum in a 64-bit integer (wrapping only past 64 bits), divided by
    // the world size once, truncating toward zero.
    uint64_t sum = 0;
    for (uint64_t v : x) {
      sum += is_signed ? static_cast<uint64_t>(AsSigned(dtype, v)) : v;
    }
    acc = is_signed ? static_cast<uint64_t>(static_cast<int64_t>(sum) / world)
                    : sum / static_cast<uint64_t>(world);
    acc &= mask;
  }
  return acc;
}

// Reduces element `first + k` (k < count) of every rank's input into an
// Expected holding `count` elements.
Expected ReduceBlock(const CollectiveCase& c, int world,
                     const std::vector<std::string>& inputs, uint64_t first,
                     uint64_t count) {
  const DType dtype = c.spec.dtype;
  const size_t size = DTypeSize(dtype);
  Expected e;
  if (IsFloatDType(dtype)) {
    e.numeric = true;
    e.values.resize(count);
    e.tolerance.resize(count);
    std::vector<long double> x(world);
    for (uint64_t k = 0; k < count; ++k) {
      for (int r = 0; r < world; ++r) {
        x[r] = LoadFloat(dtype, inputs[r].data() + (first + k) * size);
      }
      const FloatReduction reduced = ReduceFloats(c, world, x);
      e.values[k] = reduced.value;
      e.tolerance[k] = reduced.tolerance;
    }
    return e;
  }
  e.bytes.assign(count * size, '\0');
  std::vector<uint64_t> x(world);
  for (uint64_t k = 0; k < count; ++k) {
    for (int r = 0; r < world; ++r) {
      x[r] = LoadRaw(dtype, inputs[r].data() + (first + k) * size);
    }
    StoreRaw(dtype, e.bytes.data() + k * size, ReduceIntegers(c, world, x));
  }
  return e;
}

std::string FormatElement(DType dtype, const char* p) {
  if (IsFloatDType(dtype)) {
    return absl::StrFormat("%.12Lg (0x%x)", LoadFloat(dtype, p),
                           LoadRaw(dtype, p));
  }
  const uint64_t raw = LoadRaw(dtype, p);
  return IsSignedInteger(dtype) ? absl::StrCat(AsSigned(dtype, raw))
                                : absl::StrCat(raw);
}

}  // namespace

bool SameForEveryRank(CollectiveKind kind) {
  return kind == CollectiveKind::kAllReduce ||
         kind == CollectiveKind::kBroadcast ||
         kind == CollectiveKind::kAllGather;
}

std::vector<DType> AllDTypes() {
  return {DType::kF16, DType::kBF16, DType::kF32, DType::kF64, DType::kI8,
          DType::kU8,  DType::kI32,  DType::kI64, DType::kU32, DType::kU64};
}

std::vector<ReduceOp> AllReduceOps() {
  return {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMin, ReduceOp::kMax,
          ReduceOp::kAvg};
}

std::vector<CollectiveKind> AllKinds() {
  return {CollectiveKind::kAllReduce,     CollectiveKind::kReduce,
          CollectiveKind::kBroadcast,     CollectiveKind::kAllGather,
          CollectiveKind::kReduceScatter, CollectiveKind::kGather,
          CollectiveKind::kScatter,       CollectiveKind::kAllToAll,
          CollectiveKind::kBarrier};
}

bool IsFloatDType(DType dtype) {
  return dtype == DType::kF16 || dtype == DType::kBF16 ||
         dtype == DType::kF32 || dtype == DType::kF64;
}

std::vector<Algorithm> PlansFor(CollectiveKind kind) {
  std::vector<Algorithm> plans = {Algorithm::kUnspecified, Algorithm::kInline,
                                  Algorithm::kRing};
  if (kind == CollectiveKind::kAllReduce) {
    plans.push_back(Algorithm::kRecursiveDoubling);
    plans.push_back(Algorithm::kSameHost);
  }
  return plans;
}

CollectiveSpec Spec(CollectiveKind kind, DType dtype, uint64_t count,
                    ReduceOp op, int root) {
  CollectiveSpec spec;
  spec.kind = kind;
  if (kind == CollectiveKind::kBarrier) return spec;
  spec.dtype = dtype;
  spec.count = count;
  if (KindReduces(kind)) spec.op = op;
  if (KindHasRoot(kind)) spec.root = root;
  return spec;
}

void RunOnRanks(int ranks, const std::function<void(int rank)>& fn,
                const std::vector<int>& start_order) {
  std::vector<int> order = start_order;
  if (order.empty()) {
    for (int rank = 0; rank < ranks; ++rank) order.push_back(rank);
  }
  std::vector<std::thread> threads;
  threads.reserve(order.size());
  for (int rank : order) threads.emplace_back([&fn, rank] { fn(rank); });
  for (std::thread& t : threads) t.join();
}

// ---------------------------------------------------------------------------
// Cases, inputs and the reference.

std::string DescribeCase(const CollectiveCase& c, int world) {
  return absl::StrCat(DescribeSpec(c.spec), ", plan ",
                      AlgorithmName(c.algorithm), ", world ", world, ", ",
                      c.values == Values::kExact ? "exact" : "rounding",
                      " values, seed ", c.seed);
}

std::string MakeInput(const CollectiveCase& c, int world, int rank) {
  const CollectiveSpec& spec = c.spec;
  if (spec.kind == CollectiveKind::kBarrier) return "";
  const uint64_t bytes = InputBytes(spec, world, rank);
  if (InputMayBeEmpty(spec, rank)) {
    if (rank % 2 == 0) return "";
    // A full-size buffer the collective must ignore.
    const uint64_t full = spec.count * DTypeSize(spec.dtype) *
                          (spec.kind == CollectiveKind::kScatter ? world : 1);
    return std::string(full, '\xa5');
  }
  std::string input(bytes, '\0');
  FillElements(c, world, rank, 0, bytes / DTypeSize(spec.dtype), input.data());
  return input;
}

std::vector<Expected> Reference(const CollectiveCase& c, int world,
                                const std::vector<std::string>& inputs) {
  const CollectiveSpec& spec = c.spec;
  const uint64_t count = spec.count;
  const size_t size = DTypeSize(spec.dtype);
  const uint64_t block = count * size;
  const int root = spec.root;
  std::vector<Expected> out(world);
  switch (spec.kind) {
    case CollectiveKind::kAllReduce: {
      const Expected all = ReduceBlock(c, world, inputs, 0, count);
      for (Expected& e : out) e = all;
      break;
    }
    case CollectiveKind::kReduce:
      out[root] = ReduceBlock(c, world, inputs, 0, count);
      break;
    case CollectiveKind::kReduceScatter:
      for (int r = 0; r < world; ++r) {
        out[r] = ReduceBlock(c, world, inputs, r * count, count);
      }
      break;
    case CollectiveKind::kBroadcast:
      for (Expected& e : out) e.bytes = inputs[root].substr(0, block);
      break;
    case CollectiveKind::kAllGather:
    case CollectiveKind::kGather: {
      std::string all;
      for (const std::string& input : inputs) all += input;
      if (spec.kind == CollectiveKind::kGather) {
        out[root].bytes = all;
      } else {
        for (Expected& e : out) e.bytes = all;
      }
      break;
    }
    case CollectiveKind::kScatter:
      for (int r = 0; r < world; ++r) {
        out[r].bytes = inputs[root].substr(r * block, block);
      }
      break;
    case CollectiveKind::kAllToAll:
      for (int r = 0; r < world; ++r) {
        for (int p = 0; p < world; ++p) {
          out[r].bytes += inputs[p].substr(r * block, block);
        }
      }
      break;
    default:
      break;
  }
  return out;
}

::testing::AssertionResult MatchesExpected(const CollectiveCase& c,
                                           const Expected& expected,
                                           const std::string& output) {
  const DType dtype = c.spec.dtype;
  const size_t size = std::max<size_t>(1, DTypeSize(dtype));
  const uint64_t want_bytes =
      expected.numeric ? expected.values.size() * size : expected.bytes.size();
  if (output.size() != want_bytes) {
    return ::testing::AssertionFailure() << "output has " << output.size()
                                         << " bytes; expected " << want_bytes;
  }
  constexpr int kShown = 5;
  int mismatches = 0;
  std::string shown;
  const uint64_t elements = want_bytes / size;
  for (uint64_t i = 0; i < elements; ++i) {
    const char* got = output.data() + i * size;
    bool ok;
    std::string want;
    if (expected.numeric) {
      const long double g = LoadFloat(dtype, got);
      const long double w = expected.values[i];
      const long double tol = expected.tolerance[i];
      if (std::isnan(w)) {
        ok = std::isnan(g);
      } else if (tol == 0) {
        ok = g == w;
        // min and max also fix the sign of a zero result.
        if (ok && w == 0 &&
            (c.spec.op == ReduceOp::kMin || c.spec.op == ReduceOp::kMax)) {
          ok = std::signbit(g) == std::signbit(w);
        }
      } else {
        ok = std::fabs(g - w) <= tol;
      }
      want = absl::StrFormat("%.12Lg +- %.3Lg", w, tol);
    } else {
      ok = std::memcmp(got, expected.bytes.data() + i * size, size) == 0;
      if (!ok) want = FormatElement(dtype, expected.bytes.data() + i * size);
    }
    if (ok) continue;
    if (++mismatches <= kShown) {
      absl::StrAppend(&shown, "\n  [", i, "] got ", FormatElement(dtype, got),
                      ", want ", want);
    }
  }
  if (mismatches == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << mismatches << " of " << elements << " elements differ:" << shown;
}

}  // namespace chorus::test
