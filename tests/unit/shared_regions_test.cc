#include "server/worker/local/shared_regions.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

using ::testing::HasSubstr;
using ::testing::MatchesRegex;

// What /proc/self/fd/<fd> names, or "" when the descriptor is closed.
std::string LinkOf(int fd) {
  char target[256];
  const std::string path = absl::StrCat("/proc/self/fd/", fd);
  const ssize_t n = readlink(path.c_str(), target, sizeof(target) - 1);
  return n < 0 ? std::string() : std::string(target, n);
}

TEST(SharedRegionTest, Create_Sealed_ClientSeesTheSameBytesAndCannotResize) {
  absl::StatusOr<std::shared_ptr<SharedRegion>> region =
      SharedRegion::Create(7, 4096);
  ASSERT_TRUE(region.ok()) << region.status();
  EXPECT_EQ((*region)->id(), 7u);
  EXPECT_THAT((*region)->name(), MatchesRegex("chorus-[0-9a-f]{32}"));
  EXPECT_EQ(LinkOf((*region)->fd()),
            absl::StrCat("/memfd:", (*region)->name(), " (deleted)"));

  // A client reopens it as the local API's users do.
  const std::string path = absl::StrCat("/proc/self/fd/", (*region)->fd());
  const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  EXPECT_NE(ftruncate(fd, 1), 0) << "the seal must forbid shrinking";
  EXPECT_NE(ftruncate(fd, 8192), 0) << "the seal must forbid growing";
  void* mapped = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ASSERT_NE(mapped, MAP_FAILED);
  std::memcpy(mapped, "hello", 5);
  absl::StatusOr<absl::Span<char>> range = (*region)->Range(0, 5, "input");
  ASSERT_TRUE(range.ok()) << range.status();
  EXPECT_EQ(std::string(range->data(), range->size()), "hello");
  munmap(mapped, 4096);
  close(fd);
}

TEST(SharedRegionTest, Range_PastTheEndOrOverflowing_InvalidArgument) {
  absl::StatusOr<std::shared_ptr<SharedRegion>> region =
      SharedRegion::Create(1, 100);
  ASSERT_TRUE(region.ok()) << region.status();
  EXPECT_TRUE((*region)->Range(100, 0, "x").ok());
  EXPECT_TRUE((*region)->Range(0, 100, "x").ok());
  for (const auto& [offset, bytes] : {std::pair<uint64_t, uint64_t>{0, 101},
                                      {1, 100},
                                      {101, 0},
                                      {50, ~uint64_t{0}},
                                      {~uint64_t{0}, 2}}) {
    absl::StatusOr<absl::Span<char>> range =
        (*region)->Range(offset, bytes, "shared_input");
    EXPECT_EQ(range.status().code(), absl::StatusCode::kInvalidArgument)
        << offset << "+" << bytes;
    EXPECT_THAT(range.status().message(), HasSubstr("shared_input"));
  }
}

TEST(SharedRegionTest, Scratch_GivenBack_KeepsItsCapacity) {
  absl::StatusOr<std::shared_ptr<SharedRegion>> region =
      SharedRegion::Create(1, 64);
  ASSERT_TRUE(region.ok()) << region.status();
  std::string scratch = (*region)->TakeScratch();
  scratch.resize(1 << 20);
  const size_t capacity = scratch.capacity();
  (*region)->GiveScratch(std::move(scratch));
  EXPECT_GE((*region)->TakeScratch().capacity(), capacity);
}

TEST(SharedRegionsTest, Open_OverTheBound_ResourceExhaustedAndNothingHeld) {
  SharedRegions regions(1000);
  absl::StatusOr<std::shared_ptr<SharedRegion>> first =
      regions.Open("g", 0, 1, 600);
  ASSERT_TRUE(first.ok()) << first.status();
  absl::StatusOr<std::shared_ptr<SharedRegion>> second =
      regions.Open("g", 1, 1, 600);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(second.status().message(), HasSubstr("--max_shared_bytes"));
  EXPECT_EQ(regions.HeldBytes(), 600u);
  EXPECT_EQ(regions.Open("g", 0, 1, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(SharedRegionsTest, Open_Off_Unimplemented) {
  SharedRegions regions(0);
  EXPECT_EQ(regions.Open("g", 0, 1, 10).status().code(),
            absl::StatusCode::kUnimplemented);
}

TEST(SharedRegionsTest, Find_AnotherRankOrEpoch_FailedPrecondition) {
  SharedRegions regions(1 << 20);
  absl::StatusOr<std::shared_ptr<SharedRegion>> made =
      regions.Open("g", 0, 3, 10);
  ASSERT_TRUE(made.ok()) << made.status();
  const uint64_t id = (*made)->id();
  EXPECT_TRUE(regions.Find("g", 0, 3, id).ok());
  EXPECT_EQ(regions.Find("g", 1, 3, id).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(regions.Find("g", 0, 4, id).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(regions.Find("h", 0, 3, id).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(regions.Find("g", 0, 3, id + 1).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(SharedRegionsTest, Release_UnusedRegion_ClosesItsMemfdAtOnce) {
  SharedRegions regions(1 << 20);
  absl::StatusOr<std::shared_ptr<SharedRegion>> made =
      regions.Open("g", 0, 1, 10);
  ASSERT_TRUE(made.ok()) << made.status();
  const int fd = (*made)->fd();
  const std::string link = LinkOf(fd);
  const uint64_t id = (*made)->id();
  made = absl::UnknownError("dropped");  // the test's reference
  ASSERT_TRUE(regions.Release("g", 0, 1, id).ok());
  EXPECT_NE(LinkOf(fd), link);
  EXPECT_EQ(regions.HeldBytes(), 0u);
  EXPECT_EQ(regions.Release("g", 0, 1, id).code(), absl::StatusCode::kNotFound);
}

TEST(SharedRegionsTest, Release_RegionInUse_StaysMappedForItsUser) {
  SharedRegions regions(1 << 20);
  absl::StatusOr<std::shared_ptr<SharedRegion>> in_use =
      regions.Open("g", 0, 1, 10);
  ASSERT_TRUE(in_use.ok()) << in_use.status();
  ASSERT_TRUE(regions.Release("g", 0, 1, (*in_use)->id()).ok());
  // The call holding it still reads and writes it.
  absl::StatusOr<absl::Span<char>> range = (*in_use)->Range(0, 10, "x");
  ASSERT_TRUE(range.ok());
  std::memset(range->data(), 1, range->size());
  EXPECT_EQ(regions.HeldBytes(), 0u);
}

TEST(SharedRegionsTest, Forget_DropsOnlyThatMembershipsRegions) {
  SharedRegions regions(1 << 20);
  absl::StatusOr<std::shared_ptr<SharedRegion>> a = regions.Open("g", 0, 1, 10);
  absl::StatusOr<std::shared_ptr<SharedRegion>> b = regions.Open("g", 0, 1, 20);
  absl::StatusOr<std::shared_ptr<SharedRegion>> other_rank =
      regions.Open("g", 1, 1, 40);
  absl::StatusOr<std::shared_ptr<SharedRegion>> other_epoch =
      regions.Open("g", 0, 2, 80);
  ASSERT_TRUE(a.ok() && b.ok() && other_rank.ok() && other_epoch.ok());
  regions.Forget("g", 0, 1);
  EXPECT_FALSE(regions.Find("g", 0, 1, (*a)->id()).ok());
  EXPECT_FALSE(regions.Find("g", 0, 1, (*b)->id()).ok());
  EXPECT_TRUE(regions.Find("g", 1, 1, (*other_rank)->id()).ok());
  EXPECT_TRUE(regions.Find("g", 0, 2, (*other_epoch)->id()).ok());
  EXPECT_EQ(regions.HeldBytes(), 120u);
}

}  // namespace
}  // namespace chorus
