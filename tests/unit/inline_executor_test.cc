#include "server/reduce/cpu/inline_executor.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/half.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

template <typename T>
std::string Encode(const std::vector<T>& values) {
  std::string bytes(values.size() * sizeof(T), '\0');
  if (!values.empty()) std::memcpy(bytes.data(), values.data(), bytes.size());
  return bytes;
}

template <typename T>
std::vector<T> Decode(const std::string& bytes) {
  std::vector<T> values(bytes.size() / sizeof(T));
  if (!values.empty()) std::memcpy(values.data(), bytes.data(), bytes.size());
  return values;
}

std::vector<const std::string*> Pointers(const std::vector<std::string>& in) {
  std::vector<const std::string*> out;
  for (const std::string& s : in) out.push_back(&s);
  return out;
}

CollectiveSpec Spec(CollectiveKind kind, DType dtype, uint64_t count,
                    ReduceOp op = ReduceOp::kSum, int32_t root = 0) {
  CollectiveSpec spec;
  spec.kind = kind;
  spec.dtype = dtype;
  spec.count = count;
  spec.op = op;
  spec.root = root;
  return spec;
}

// ---- A plain reference, element by element, ranks combined in order. ------

template <typename T>
T Combine(ReduceOp op, T a, T b) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return static_cast<T>(a + b);
    case ReduceOp::kProd:
      return static_cast<T>(a * b);
    case ReduceOp::kMin:
      return std::min(a, b);
    case ReduceOp::kMax:
      return std::max(a, b);
    default:
      ADD_FAILURE() << "bad op";
      return a;
  }
}

template <typename T>
std::vector<T> ReduceRange(const CollectiveSpec& spec, int world,
                           const std::vector<std::vector<T>>& in,
                           size_t offset) {
  std::vector<T> out(spec.count);
  for (size_t i = 0; i < spec.count; ++i) {
    if (spec.op == ReduceOp::kAvg && std::is_integral<T>::value) {
      // Integer avg sums in 64 bits and divides once.
      using Wide =
          std::conditional_t<std::is_signed<T>::value, int64_t, uint64_t>;
      Wide sum = 0;
      for (int r = 0; r < world; ++r) sum += in[r][offset + i];
      out[i] = static_cast<T>(sum / static_cast<Wide>(world));
      continue;
    }
    T acc = in[0][offset + i];
    for (int r = 1; r < world; ++r)
      acc = Combine(spec.op, acc, in[r][offset + i]);
    if (spec.op == ReduceOp::kAvg)
      acc = static_cast<T>(acc / static_cast<T>(world));
    out[i] = acc;
  }
  return out;
}

template <typename T>
std::vector<T> Slice(const std::vector<T>& v, size_t offset, size_t n) {
  return std::vector<T>(v.begin() + offset, v.begin() + offset + n);
}

template <typename T>
std::vector<std::vector<T>> Reference(const CollectiveSpec& spec, int world,
                                      const std::vector<std::vector<T>>& in) {
  const size_t n = spec.count;
  const int root = spec.root;
  std::vector<std::vector<T>> out(world);
  std::vector<T> all;
  switch (spec.kind) {
    case CollectiveKind::kAllReduce:
      for (auto& o : out) o = ReduceRange(spec, world, in, 0);
      break;
    case CollectiveKind::kReduce:
      out[root] = ReduceRange(spec, world, in, 0);
      break;
    case CollectiveKind::kReduceScatter:
      for (int r = 0; r < world; ++r)
        out[r] = ReduceRange(spec, world, in, r * n);
      break;
    case CollectiveKind::kBroadcast:
      for (auto& o : out) o = in[root];
      break;
    case CollectiveKind::kAllGather:
    case CollectiveKind::kGather:
      for (int r = 0; r < world; ++r) {
        all.insert(all.end(), in[r].begin(), in[r].end());
      }
      if (spec.kind == CollectiveKind::kGather) {
        out[root] = all;
      } else {
        for (auto& o : out) o = all;
      }
      break;
    case CollectiveKind::kScatter:
      for (int r = 0; r < world; ++r) out[r] = Slice(in[root], r * n, n);
      break;
    case CollectiveKind::kAllToAll:
      for (int r = 0; r < world; ++r) {
        for (int p = 0; p < world; ++p) {
          std::vector<T> block = Slice(in[p], r * n, n);
          out[r].insert(out[r].end(), block.begin(), block.end());
        }
      }
      break;
    default:
      ADD_FAILURE() << "bad kind";
  }
  return out;
}

// Small values with negatives (for signed types) and fractions (for floats),
// different on every rank and element, none overflowing a sum of 5 ranks.
template <typename T>
T Value(int rank, size_t i) {
  const int v = static_cast<int>((rank * 13 + i * 7) % 17);
  if constexpr (std::is_floating_point_v<T>) {
    return static_cast<T>(v) * static_cast<T>(0.25) - static_cast<T>(2);
  } else if constexpr (std::is_signed_v<T>) {
    return static_cast<T>(v - 8);
  } else {
    return static_cast<T>(v);
  }
}

template <typename T>
void CheckCase(const CollectiveSpec& spec, int world) {
  SCOPED_TRACE(absl::StrCat(DescribeSpec(spec), " world ", world));
  std::vector<std::vector<T>> in(world);
  std::vector<std::string> bytes(world);
  for (int r = 0; r < world; ++r) {
    if (!InputMayBeEmpty(spec, r) || r % 2 == 0) {
      // Off-root ranks of broadcast and scatter pass nothing or (even
      // ranks) a full buffer that must be ignored.
      const size_t n =
          (InputMayBeEmpty(spec, r) ? InputBytes(spec, world, spec.root)
                                    : InputBytes(spec, world, r)) /
          sizeof(T);
      for (size_t i = 0; i < n; ++i) in[r].push_back(Value<T>(r, i));
    }
    bytes[r] = Encode(in[r]);
  }
  absl::StatusOr<std::vector<std::string>> out =
      RunInline(spec, world, Pointers(bytes));
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->size(), static_cast<size_t>(world));
  const std::vector<std::vector<T>> want = Reference(spec, world, in);
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ((*out)[r].size(), OutputBytes(spec, world, r)) << "rank " << r;
    EXPECT_EQ(Decode<T>((*out)[r]), want[r]) << "rank " << r;
  }
}

template <typename T>
void CheckKind(CollectiveKind kind, DType dtype) {
  std::vector<ReduceOp> ops = {ReduceOp::kSum};
  if (KindReduces(kind)) {
    ops = {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMin, ReduceOp::kMax,
           ReduceOp::kAvg};
  }
  for (int world : {1, 2, 3, 5}) {
    for (ReduceOp op : ops) {
      for (int root : {0, world - 1, world / 2}) {
        for (uint64_t count : {uint64_t{1}, uint64_t{3}, uint64_t{37}}) {
          CheckCase<T>(Spec(kind, dtype, count, op, root), world);
        }
      }
    }
  }
}

void CheckKindAllTypes(CollectiveKind kind) {
  CheckKind<float>(kind, DType::kF32);
  CheckKind<double>(kind, DType::kF64);
  CheckKind<int32_t>(kind, DType::kI32);
  CheckKind<uint8_t>(kind, DType::kU8);
  CheckKind<int64_t>(kind, DType::kI64);
}

TEST(RunInlineTest, RunInline_AllReduce_MatchesReference) {
  CheckKindAllTypes(CollectiveKind::kAllReduce);
}

TEST(RunInlineTest, RunInline_Reduce_MatchesReference) {
  CheckKindAllTypes(CollectiveKind::kReduce);
}

TEST(RunInlineTest, RunInline_Broadcast_MatchesReference) {
  CheckKindAllTypes(CollectiveKind::kBroadcast);
}

TEST(RunInlineTest, RunInline_AllGather_MatchesReference) {
  CheckKindAllTypes(CollectiveKind::kAllGather);
}

TEST(RunInlineTest, RunInline_ReduceScatter_MatchesReference) {
  CheckKindAllTypes(CollectiveKind::kReduceScatter);
}

TEST(RunInlineTest, RunInline_Gather_MatchesReference) {
  CheckKindAllTypes(CollectiveKind::kGather);
}

TEST(RunInlineTest, RunInline_Scatter_MatchesReference) {
  CheckKindAllTypes(CollectiveKind::kScatter);
}

TEST(RunInlineTest, RunInline_AllToAll_MatchesReference) {
  CheckKindAllTypes(CollectiveKind::kAllToAll);
}

TEST(RunInlineTest, RunInline_AllReduceSumI32_KnownValues) {
  const std::vector<std::string> in = {Encode<int32_t>({1, 2, 3}),
                                       Encode<int32_t>({10, 20, 30})};
  absl::StatusOr<std::vector<std::string>> out = RunInline(
      Spec(CollectiveKind::kAllReduce, DType::kI32, 3), 2, Pointers(in));
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(Decode<int32_t>((*out)[0]), (std::vector<int32_t>{11, 22, 33}));
  EXPECT_EQ(Decode<int32_t>((*out)[1]), (std::vector<int32_t>{11, 22, 33}));
}

TEST(RunInlineTest, RunInline_AvgF32_SumDividedByWorld) {
  const std::vector<std::string> in = {Encode<float>({1.0f, -3.0f}),
                                       Encode<float>({2.0f, 0.5f}),
                                       Encode<float>({4.0f, 1.0f})};
  absl::StatusOr<std::vector<std::string>> out = RunInline(
      Spec(CollectiveKind::kAllReduce, DType::kF32, 2, ReduceOp::kAvg), 3,
      Pointers(in));
  ASSERT_TRUE(out.ok()) << out.status();
  for (const std::string& o : *out) {
    EXPECT_EQ(Decode<float>(o), (std::vector<float>{7.0f / 3.0f, -0.5f}));
  }
}

TEST(RunInlineTest, RunInline_AvgI32_TruncatesTowardZero) {
  const std::vector<std::string> in = {Encode<int32_t>({-5, 5, 1, -1}),
                                       Encode<int32_t>({-2, 2, 1, 0}),
                                       Encode<int32_t>({0, 0, 1, 0})};
  absl::StatusOr<std::vector<std::string>> out = RunInline(
      Spec(CollectiveKind::kAllReduce, DType::kI32, 4, ReduceOp::kAvg), 3,
      Pointers(in));
  ASSERT_TRUE(out.ok()) << out.status();
  for (const std::string& o : *out) {
    EXPECT_EQ(Decode<int32_t>(o), (std::vector<int32_t>{-2, 2, 1, 0}));
  }
}

TEST(RunInlineTest, RunInline_AvgReduceScatterI32_EachBlockAveraged) {
  const std::vector<std::string> in = {Encode<int32_t>({4, 10}),
                                       Encode<int32_t>({8, -3})};
  absl::StatusOr<std::vector<std::string>> out = RunInline(
      Spec(CollectiveKind::kReduceScatter, DType::kI32, 1, ReduceOp::kAvg), 2,
      Pointers(in));
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(Decode<int32_t>((*out)[0]), std::vector<int32_t>{6});
  EXPECT_EQ(Decode<int32_t>((*out)[1]), std::vector<int32_t>{3});
}

TEST(RunInlineTest, RunInline_HalfTypes_AccumulateAndRoundBack) {
  // bf16 1.0 + 2.0 = 3.0 and f16 1.0 + 2.0 = 3.0, as raw bit patterns.
  const std::vector<std::string> bf16 = {Encode<uint16_t>({0x3F80}),
                                         Encode<uint16_t>({0x4000})};
  absl::StatusOr<std::vector<std::string>> out = RunInline(
      Spec(CollectiveKind::kAllReduce, DType::kBF16, 1), 2, Pointers(bf16));
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(Decode<uint16_t>((*out)[1]), std::vector<uint16_t>{0x4040});
  const std::vector<std::string> f16 = {Encode<uint16_t>({0x3C00}),
                                        Encode<uint16_t>({0x4000})};
  out = RunInline(
      Spec(CollectiveKind::kAllReduce, DType::kF16, 1, ReduceOp::kMax), 2,
      Pointers(f16));
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(Decode<uint16_t>((*out)[0]), std::vector<uint16_t>{0x4000});
}

TEST(RunInlineTest, RunInline_F16Sum_AccumulatesInF32AndRoundsOnce) {
  // Rounding to f16 after each add gives 0.016113; f32 accumulation rounds
  // once, to 0.016235.
  const float x[] = {0.12537f, 0.43384f, -0.54297f};
  std::vector<std::string> in;
  float wide = 0;
  for (float v : x) {
    const Float16 h = ToFloat16(v);
    in.push_back(Encode<uint16_t>({h.bits}));
    wide += ToFloat(h);
  }
  absl::StatusOr<std::vector<std::string>> out = RunInline(
      Spec(CollectiveKind::kAllReduce, DType::kF16, 1), 3, Pointers(in));
  ASSERT_TRUE(out.ok()) << out.status();
  const uint16_t got = Decode<uint16_t>((*out)[0])[0];
  EXPECT_EQ(got, ToFloat16(wide).bits);
  EXPECT_NEAR(ToFloat(Float16{got}), 0.016235f, 1e-6f);
}

TEST(RunInlineTest, RunInline_BF16AvgAndProd_AccumulateInF32) {
  // 1 + 2^-8 + 2^-8 + ... : every partial sum rounds back to 1 in bf16, but
  // not in f32.
  const uint16_t one = ToBFloat16(1.0f).bits;
  const uint16_t small = ToBFloat16(1.0f / 256).bits;
  const std::vector<std::string> in = {
      Encode<uint16_t>({one, one}), Encode<uint16_t>({small, one}),
      Encode<uint16_t>({small, one}), Encode<uint16_t>({small, one})};
  absl::StatusOr<std::vector<std::string>> out = RunInline(
      Spec(CollectiveKind::kAllReduce, DType::kBF16, 2, ReduceOp::kSum), 4,
      Pointers(in));
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(Decode<uint16_t>((*out)[0])[0], ToBFloat16(1.0f + 3.0f / 256).bits);
  out = RunInline(
      Spec(CollectiveKind::kAllReduce, DType::kBF16, 2, ReduceOp::kAvg), 4,
      Pointers(in));
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(Decode<uint16_t>((*out)[0])[0],
            ToBFloat16((1.0f + 3.0f / 256) / 4).bits);
  EXPECT_EQ(Decode<uint16_t>((*out)[0])[1], one);
}

TEST(RunInlineTest, RunInline_AvgI8_SumsInSixtyFourBits) {
  // Maximum, minimum and mixed signs; the sum of three 127s would wrap in
  // eight bits.
  const std::vector<std::string> in = {Encode<int8_t>({127, -128, 127, -7, 1}),
                                       Encode<int8_t>({127, -128, -128, 0, 1}),
                                       Encode<int8_t>({127, -128, 1, 0, 0})};
  absl::StatusOr<std::vector<std::string>> out =
      RunInline(Spec(CollectiveKind::kAllReduce, DType::kI8, 5, ReduceOp::kAvg),
                3, Pointers(in));
  ASSERT_TRUE(out.ok()) << out.status();
  for (const std::string& o : *out) {
    // 381/3, -384/3, 0/3, -7/3 -> -2 (toward zero), 2/3 -> 0.
    EXPECT_EQ(Decode<int8_t>(o), (std::vector<int8_t>{127, -128, 0, -2, 0}));
  }
}

TEST(RunInlineTest, RunInline_AvgUnsigned_SumsInSixtyFourBits) {
  const std::vector<std::string> u8 = {Encode<uint8_t>({255, 255}),
                                       Encode<uint8_t>({255, 0})};
  absl::StatusOr<std::vector<std::string>> out =
      RunInline(Spec(CollectiveKind::kAllReduce, DType::kU8, 2, ReduceOp::kAvg),
                2, Pointers(u8));
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(Decode<uint8_t>((*out)[0]), (std::vector<uint8_t>{255, 127}));
  const uint32_t max32 = 0xffffffffu;
  const std::vector<std::string> u32 = {Encode<uint32_t>({max32}),
                                        Encode<uint32_t>({max32}),
                                        Encode<uint32_t>({max32})};
  out = RunInline(
      Spec(CollectiveKind::kAllReduce, DType::kU32, 1, ReduceOp::kAvg), 3,
      Pointers(u32));
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(Decode<uint32_t>((*out)[2]), std::vector<uint32_t>{max32});
}

TEST(RunInlineTest, RunInline_Barrier_EmptyOutputs) {
  const std::vector<std::string> in(3);
  CollectiveSpec barrier;
  barrier.kind = CollectiveKind::kBarrier;
  absl::StatusOr<std::vector<std::string>> out =
      RunInline(barrier, 3, Pointers(in));
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out, std::vector<std::string>(3));
}

TEST(RunInlineTest, RunInline_ZeroCount_EmptyOutputs) {
  const std::vector<std::string> in(2);
  absl::StatusOr<std::vector<std::string>> out = RunInline(
      Spec(CollectiveKind::kAllGather, DType::kF32, 0), 2, Pointers(in));
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out, std::vector<std::string>(2));
}

TEST(RunInlineTest, RunInline_WrongInputSize_InvalidArgument) {
  const std::vector<std::string> in = {Encode<int32_t>({1, 2, 3}),
                                       Encode<int32_t>({1, 2})};
  absl::StatusOr<std::vector<std::string>> out = RunInline(
      Spec(CollectiveKind::kAllReduce, DType::kI32, 3), 2, Pointers(in));
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(out.status().message(), "rank 1 input has 8 bytes; expected 12");
}

TEST(RunInlineTest, RunInline_InputForZeroCount_InvalidArgument) {
  // count 0 means every input must be empty; 4 stray bytes are malformed and
  // must not leak into the gathered output.
  const std::vector<std::string> in = {std::string(4, 'x'), ""};
  absl::StatusOr<std::vector<std::string>> out = RunInline(
      Spec(CollectiveKind::kAllGather, DType::kF32, 0), 2, Pointers(in));
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(RunInlineTest, RunInline_RootInputMissing_InvalidArgument) {
  const std::vector<std::string> in = {Encode<int32_t>({1}), ""};
  absl::StatusOr<std::vector<std::string>> out =
      RunInline(Spec(CollectiveKind::kBroadcast, DType::kI32, 1,
                     ReduceOp::kUnspecified, /*root=*/1),
                2, Pointers(in));
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(RunInlineTest, RunInline_InputCountNotWorld_InvalidArgument) {
  const std::vector<std::string> in = {Encode<int32_t>({1})};
  absl::StatusOr<std::vector<std::string>> out = RunInline(
      Spec(CollectiveKind::kAllReduce, DType::kI32, 1), 2, Pointers(in));
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(out.status().message(), "one input per rank is needed");
}

TEST(RunInlineTest, RunInline_MalformedSpec_InvalidArgument) {
  const std::vector<std::string> in = {Encode<int32_t>({1}),
                                       Encode<int32_t>({2})};
  EXPECT_EQ(RunInline(Spec(CollectiveKind::kAllReduce, DType::kI32, 1,
                           ReduceOp::kUnspecified),
                      2, Pointers(in))
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RunInline(Spec(static_cast<CollectiveKind>(12), DType::kI32, 1), 2,
                      Pointers(in))
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RunInline(Spec(CollectiveKind::kGather, DType::kI32, 1,
                           ReduceOp::kSum, /*root=*/2),
                      2, Pointers(in))
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace chorus
