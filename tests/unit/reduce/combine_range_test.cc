// Runs the CUDA kernels' body (server/reduce/cuda/combine_range.h) on the
// host, simulating every thread of a grid, and checks it against the CPU
// engine for all alignments of dst, a and b within a 16-byte pack: the head /
// pack / tail split covers each element exactly once, never writes outside
// [0, count), and only issues aligned pack loads (the host LoadPack aborts
// otherwise). Needs no GPU and no CUDA toolkit.
#include "server/reduce/cuda/combine_range.h"

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/dtype.h"
#include "gtest/gtest.h"
#include "server/reduce/cpu/cpu_reduce.h"
#include "server/reduce/dispatch.h"
#include "tests/unit/reduce/reference.h"
#include "tests/unit/reduce/test_values.h"

namespace chorus {
namespace {

using cuda_reduce::internal::CombineRange;
using cuda_reduce::internal::FinalizeRange;
using cuda_reduce::internal::Pack;
using cuda_reduce::internal::Split;
using cuda_reduce::internal::SplitRange;
using reduce_test::DTypeOf;
using reduce_test::RandomValues;
using reduce_test::SameResult;

constexpr ReduceOp kCombineOps[] = {ReduceOp::kSum, ReduceOp::kProd,
                                    ReduceOp::kMin, ReduceOp::kMax};
constexpr size_t kStrides[] = {1, 7, 256};

std::vector<size_t> Sizes() {
  std::vector<size_t> sizes;
  for (size_t n = 0; n <= 40; ++n) sizes.push_back(n);
  for (size_t n : {63, 64, 65, 1023}) sizes.push_back(n);
  return sizes;
}

// A 16-byte aligned buffer of `count` elements of T.
template <typename T>
class AlignedBuffer {
 public:
  explicit AlignedBuffer(size_t count)
      : packs_(new Pack<T>[count / Pack<T>::kLanes + 1]) {}
  T* data() { return reinterpret_cast<T*>(packs_.get()); }

 private:
  std::unique_ptr<Pack<T>[]> packs_;
};

// Runs `body(first, stride)` for every simulated thread of the grid.
template <typename Body>
void ForEachThread(size_t stride, Body body) {
  for (size_t first = 0; first < stride; ++first) body(first, stride);
}

template <typename T>
::testing::AssertionResult SameBuffer(const T* got,
                                      const std::vector<T>& want) {
  for (size_t i = 0; i < want.size(); ++i) {
    if (!SameResult(got[i], want[i])) {
      return ::testing::AssertionFailure() << "buffer element " << i;
    }
  }
  return ::testing::AssertionSuccess();
}

template <typename T>
class CombineRangeTypedTest : public ::testing::Test {};

using AllTypes =
    ::testing::Types<Float16, BFloat16, float, double, int8_t, uint8_t, int32_t,
                     int64_t, uint32_t, uint64_t>;
TYPED_TEST_SUITE(CombineRangeTypedTest, AllTypes);

TYPED_TEST(CombineRangeTypedTest,
           CombineRange_EveryAlignment_MatchesCpuEngine) {
  using T = TypeParam;
  const DType dtype = DTypeOf<T>();
  constexpr size_t kLanes = Pack<T>::kLanes;
  const size_t offsets[] = {0, 1, kLanes - 1};
  const size_t capacity = 1023 + 2 * kLanes;
  const std::vector<T> a_values = RandomValues<T>(capacity, 21);
  const std::vector<T> b_values = RandomValues<T>(capacity, 22);
  const std::vector<T> init = RandomValues<T>(capacity, 23);
  AlignedBuffer<T> a_buffer(capacity), b_buffer(capacity), out(capacity);
  std::memcpy(a_buffer.data(), a_values.data(), capacity * sizeof(T));
  std::memcpy(b_buffer.data(), b_values.data(), capacity * sizeof(T));

  for (ReduceOp op : kCombineOps) {
    reduce::DispatchCombineOp(op, [&](auto combine) {
      for (size_t size : Sizes()) {
        for (size_t dst_off : offsets) {
          for (size_t a_off : offsets) {
            for (size_t b_off : offsets) {
              for (bool in_place : {false, true}) {
                for (size_t stride : kStrides) {
                  SCOPED_TRACE(absl::StrCat(
                      DTypeName(dtype), " ", ReduceOpName(op), " size ", size,
                      " offsets dst ", dst_off, " a ", a_off, " b ", b_off,
                      in_place ? " in place" : "", " stride ", stride));
                  // dst starts one pack in, leaving a guard area before it.
                  T* dst = out.data() + kLanes + dst_off;
                  const T* a = in_place ? dst : a_buffer.data() + a_off;
                  const T* b = b_buffer.data() + b_off;
                  std::memcpy(out.data(), init.data(), capacity * sizeof(T));
                  std::vector<T> want = init;
                  ASSERT_TRUE(cpu_reduce::Reduce(
                                  op, dtype, want.data() + kLanes + dst_off,
                                  in_place ? want.data() + kLanes + dst_off
                                           : a_values.data() + a_off,
                                  b_values.data() + b_off, size)
                                  .ok());
                  const Split split = SplitRange(
                      sizeof(T), size, reinterpret_cast<uintptr_t>(dst),
                      reinterpret_cast<uintptr_t>(a),
                      reinterpret_cast<uintptr_t>(b));
                  ForEachThread(stride, [&](size_t first, size_t step) {
                    CombineRange(combine, dst, a, b, size, split, first, step);
                  });
                  ASSERT_TRUE(SameBuffer(out.data(), want));
                }
              }
            }
          }
        }
      }
    });
  }
}

TYPED_TEST(CombineRangeTypedTest,
           FinalizeRange_EveryAlignment_MatchesCpuEngine) {
  using T = TypeParam;
  const DType dtype = DTypeOf<T>();
  constexpr size_t kLanes = Pack<T>::kLanes;
  const size_t capacity = 1023 + 2 * kLanes;
  const std::vector<T> init = RandomValues<T>(capacity, 24);
  AlignedBuffer<T> out(capacity);
  for (size_t size : Sizes()) {
    for (size_t offset = 0; offset < kLanes; ++offset) {
      for (size_t stride : kStrides) {
        SCOPED_TRACE(absl::StrCat(DTypeName(dtype), " size ", size, " offset ",
                                  offset, " stride ", stride));
        std::memcpy(out.data(), init.data(), capacity * sizeof(T));
        std::vector<T> want = init;
        ASSERT_TRUE(
            cpu_reduce::FinalizeAvg(dtype, want.data() + offset, size, 5).ok());
        T* data = out.data() + offset;
        const uintptr_t address = reinterpret_cast<uintptr_t>(data);
        const Split split =
            SplitRange(sizeof(T), size, address, address, address);
        ForEachThread(stride, [&](size_t first, size_t step) {
          FinalizeRange(reduce::AvgFinalize{5}, data, size, split, first, step);
        });
        ASSERT_TRUE(SameBuffer(out.data(), want));
      }
    }
  }
}

TEST(SplitRangeTest, SplitRange_CommonAlignment_UsesPacksAfterHead) {
  // 4-byte elements, dst 4 bytes past a pack boundary: 3 head elements.
  const Split split = SplitRange(4, 100, 0x1004, 0x2004, 0x3004);
  EXPECT_EQ(split.head, 3u);
  EXPECT_EQ(split.packs, 24u);  // 97 elements left: 24 packs, 1 tail.
}

TEST(SplitRangeTest, SplitRange_DifferentAlignment_IsAllScalar) {
  const Split split = SplitRange(4, 100, 0x1004, 0x2000, 0x3004);
  EXPECT_EQ(split.head, 100u);
  EXPECT_EQ(split.packs, 0u);
}

TEST(SplitRangeTest, SplitRange_CountShorterThanHead_IsAllHead) {
  const Split split = SplitRange(1, 3, 0x1001, 0x2001, 0x3001);
  EXPECT_EQ(split.head, 3u);
  EXPECT_EQ(split.packs, 0u);
}

}  // namespace
}  // namespace chorus
