// The public C++ headers stand alone: this file is compiled with only
// include/ (and the system's Abseil) on its include path, so an
// include of a server/ header or a generated proto from a public header
// fails the build.
#include <cstdint>

#include "chorus/admin_client.h"
#include "chorus/communicator.h"
#include "chorus/status_facts.h"
#include "chorus/types.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

TEST(PublicHeadersTest, DTypeOf_ArithmeticTypes_MatchTheirDTypes) {
  static_assert(DTypeOf<float>() == DType::kF32);
  static_assert(DTypeOf<double>() == DType::kF64);
  static_assert(DTypeOf<int32_t>() == DType::kI32);
  static_assert(DTypeOf<uint64_t>() == DType::kU64);
  EXPECT_EQ(static_cast<int>(DTypeOf<int8_t>()), 5);
}

TEST(PublicHeadersTest, Defaults_PlainValues_AsDocumented) {
  const JoinOptions join;
  EXPECT_EQ(join.device.kind, DeviceKind::kCpu);
  const CallOptions call;
  EXPECT_EQ(call.algorithm, Algorithm::kUnspecified);
  const CollectiveSpec spec;
  EXPECT_EQ(spec.kind, CollectiveKind::kUnspecified);
  const GroupInfo group;
  EXPECT_TRUE(group.aborted.ok());
  EXPECT_EQ(group.pending_sequence, 0u);
  const StatusFacts facts;
  EXPECT_TRUE(facts.reason.empty());
  EXPECT_FALSE(facts.number_used);
}

}  // namespace
}  // namespace chorus
