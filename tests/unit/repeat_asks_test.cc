// RepeatAsks: a small all-reduce asks for a same_host plan from its shape's
// second call in a group epoch, one ask of a rank at a time.
#include "server/worker/repeat_asks.h"

#include <memory>
#include <string>

#include "gtest/gtest.h"
#include "tests/testing/collective_reference.h"

namespace chorus {
namespace {

CollectiveSpec AllReduce(uint64_t count, DType dtype = DType::kF32,
                         ReduceOp op = ReduceOp::kSum) {
  return test::Spec(CollectiveKind::kAllReduce, dtype, count, op);
}

TEST(RepeatAsksTest, TryAsk_ShapeCalledBefore_AsksOnceAtATime) {
  RepeatAsks asks;
  EXPECT_EQ(asks.TryAsk("g", 1, 0, AllReduce(2)), nullptr);
  std::shared_ptr<const void> token = asks.TryAsk("g", 1, 0, AllReduce(2));
  ASSERT_NE(token, nullptr);
  // Another call of the rank while the first asks rides inline.
  EXPECT_EQ(asks.TryAsk("g", 1, 0, AllReduce(2)), nullptr);
  // Other ranks, groups and epochs ask on their own.
  EXPECT_EQ(asks.TryAsk("g", 1, 1, AllReduce(2)), nullptr);
  EXPECT_NE(asks.TryAsk("g", 1, 1, AllReduce(2)), nullptr);
  token.reset();
  EXPECT_NE(asks.TryAsk("g", 1, 0, AllReduce(2)), nullptr);
}

TEST(RepeatAsksTest, TryAsk_OtherShape_FirstCallDoesNotAsk) {
  RepeatAsks asks;
  EXPECT_EQ(asks.TryAsk("g", 1, 0, AllReduce(2)), nullptr);
  EXPECT_EQ(asks.TryAsk("g", 1, 0, AllReduce(3)), nullptr);
  EXPECT_EQ(asks.TryAsk("g", 1, 0, AllReduce(2, DType::kI32)), nullptr);
  EXPECT_EQ(asks.TryAsk("g", 1, 0, AllReduce(2, DType::kF32, ReduceOp::kMax)),
            nullptr);
  EXPECT_EQ(asks.TryAsk("g", 2, 0, AllReduce(2)), nullptr);
  EXPECT_EQ(asks.TryAsk("h", 1, 0, AllReduce(2)), nullptr);
  EXPECT_NE(asks.TryAsk("g", 1, 0, AllReduce(3)), nullptr);
}

TEST(RepeatAsksTest, Drop_EpochEnded_ShapesForgotten) {
  RepeatAsks asks;
  asks.TryAsk("g", 1, 0, AllReduce(2));
  asks.TryAsk("g", 1, 1, AllReduce(2));
  std::shared_ptr<const void> token = asks.TryAsk("g", 1, 0, AllReduce(2));
  asks.Drop("g", 1, 0);
  EXPECT_EQ(asks.TryAsk("g", 1, 0, AllReduce(2)), nullptr);
  EXPECT_NE(asks.TryAsk("g", 1, 1, AllReduce(2)), nullptr);
  asks.Drop("g", 1);
  EXPECT_EQ(asks.TryAsk("g", 1, 1, AllReduce(2)), nullptr);
  // A token that outlives its rank's entry ends harmlessly.
  token.reset();
}

TEST(RepeatAsksTest, TryAsk_ManyRanks_LeastRecentlyUsedForgotten) {
  RepeatAsks asks;
  for (int rank = 0; rank <= static_cast<int>(RepeatAsks::kMaxRanks); ++rank) {
    asks.TryAsk("g", 1, rank, AllReduce(2));
  }
  // Rank 0 went first; the newest ones are remembered.
  EXPECT_EQ(asks.TryAsk("g", 1, 0, AllReduce(2)), nullptr);
  EXPECT_NE(asks.TryAsk("g", 1, RepeatAsks::kMaxRanks, AllReduce(2)), nullptr);
}

}  // namespace
}  // namespace chorus
