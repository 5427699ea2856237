#include "common/memfd_region.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

// What /proc/self/fd/<fd> names, or "" when the descriptor is closed.
std::string LinkOf(int fd) {
  char target[256];
  const std::string path = absl::StrCat("/proc/self/fd/", fd);
  const ssize_t n = readlink(path.c_str(), target, sizeof(target) - 1);
  return n < 0 ? std::string() : std::string(target, n);
}

TEST(MemfdRegionTest, Create_NamedSizedAndMapped) {
  absl::StatusOr<std::unique_ptr<MemfdRegion>> region =
      MemfdRegion::Create("chorus-test", 5000);
  ASSERT_TRUE(region.ok()) << region.status();
  EXPECT_EQ((*region)->name(), "chorus-test");
  EXPECT_EQ((*region)->bytes(), 5000u);
  EXPECT_EQ(LinkOf((*region)->fd()), "/memfd:chorus-test (deleted)");
  struct stat st;
  ASSERT_EQ(fstat((*region)->fd(), &st), 0);
  EXPECT_EQ(st.st_size, 5000);
  // Fresh memory reads as zeros and takes writes to its last byte.
  EXPECT_EQ((*region)->data()[4999], 0);
  (*region)->data()[4999] = 7;
}

TEST(MemfdRegionTest, Create_AnotherMappingSeesTheBytesAndCannotResize) {
  absl::StatusOr<std::unique_ptr<MemfdRegion>> region =
      MemfdRegion::Create("chorus-test", 4096);
  ASSERT_TRUE(region.ok()) << region.status();
  // Another process opens it as applications and peer ranks do.
  const std::string path = absl::StrCat("/proc/self/fd/", (*region)->fd());
  const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  EXPECT_NE(ftruncate(fd, 1), 0) << "the seal must forbid shrinking";
  EXPECT_NE(ftruncate(fd, 8192), 0) << "the seal must forbid growing";
  void* mapped = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ASSERT_NE(mapped, MAP_FAILED);
  std::memcpy(mapped, "theirs", 6);
  EXPECT_EQ(std::memcmp((*region)->data(), "theirs", 6), 0);
  std::memcpy((*region)->data() + 100, "ours", 4);
  EXPECT_EQ(std::memcmp(static_cast<char*>(mapped) + 100, "ours", 4), 0);
  munmap(mapped, 4096);
  close(fd);
}

TEST(MemfdRegionTest, Create_ZeroBytes_ResourceExhaustedNamingTheStep) {
  absl::StatusOr<std::unique_ptr<MemfdRegion>> region =
      MemfdRegion::Create("chorus-test", 0);
  EXPECT_EQ(region.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(region.status().message()),
              StartsWith("mmap failed: "));
}

TEST(MemfdRegionTest, Range_InsideTheRegion_ThoseBytes) {
  absl::StatusOr<std::unique_ptr<MemfdRegion>> region =
      MemfdRegion::Create("chorus-test", 100);
  ASSERT_TRUE(region.ok()) << region.status();
  std::optional<absl::Span<char>> range = (*region)->Range(10, 90);
  ASSERT_TRUE(range.has_value());
  EXPECT_EQ(range->data(), (*region)->data() + 10);
  EXPECT_EQ(range->size(), 90u);
  EXPECT_TRUE((*region)->Range(0, 100).has_value());
  EXPECT_TRUE((*region)->Range(100, 0).has_value());
}

TEST(MemfdRegionTest, Range_PastTheEndOrOverflowing_Nullopt) {
  absl::StatusOr<std::unique_ptr<MemfdRegion>> region =
      MemfdRegion::Create("chorus-test", 100);
  ASSERT_TRUE(region.ok()) << region.status();
  for (const auto& [offset, bytes] : {std::pair<uint64_t, uint64_t>{0, 101},
                                      {1, 100},
                                      {101, 0},
                                      {50, ~uint64_t{0}},
                                      {~uint64_t{0}, 2}}) {
    EXPECT_FALSE((*region)->Range(offset, bytes).has_value())
        << offset << "+" << bytes;
  }
}

TEST(MemfdRegionTest, Destruction_ClosesTheMemfd) {
  absl::StatusOr<std::unique_ptr<MemfdRegion>> region =
      MemfdRegion::Create("chorus-test", 64);
  ASSERT_TRUE(region.ok()) << region.status();
  const int fd = (*region)->fd();
  const std::string link = LinkOf(fd);
  EXPECT_THAT(link, HasSubstr("chorus-test"));
  region->reset();
  EXPECT_NE(LinkOf(fd), link);
}

}  // namespace
}  // namespace chorus
