// This build's NCCL (BuiltInNcclRuntime) where no GPU may be present: the
// id a rank relays to its peers, and a communicator that cannot start
// refused with a status instead of a crash.
#include "server/worker/gpu/nccl_runtime.h"

#include <string>

#include "gtest/gtest.h"

namespace chorus {
namespace {

TEST(NcclRuntimeTest, NewId_BuiltWithNccl_IdOfNcclsSizeEachTimeNew) {
  NcclRuntime* nccl = BuiltInNcclRuntime();
  if (nccl->version() == 0) {
    EXPECT_EQ(nccl->NewId().status().code(), absl::StatusCode::kUnimplemented);
    GTEST_SKIP() << "built without NCCL";
  }
  absl::StatusOr<std::string> first = nccl->NewId();
  absl::StatusOr<std::string> second = nccl->NewId();
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(first->size(), NcclRuntime::kIdBytes);
  EXPECT_NE(*first, *second);
}

TEST(NcclRuntimeTest, StartComm_MalformedId_InvalidArgument) {
  NcclRuntime* nccl = BuiltInNcclRuntime();
  if (nccl->version() == 0) GTEST_SKIP() << "built without NCCL";
  EXPECT_EQ(nccl->StartComm(0, "short", 2, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace chorus
