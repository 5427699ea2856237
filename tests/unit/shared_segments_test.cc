#include "server/worker/algorithms/shared_segments.h"

#include <unistd.h>

#include <cstring>

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

TEST(SharedSegmentsTest, MapPeer_OwnSegment_SeesWhatWasWritten) {
  SharedSegments& segments = SharedSegments::Get();
  absl::StatusOr<SharedSegments::Own> own = segments.Acquire(1000);
  ASSERT_TRUE(own.ok()) << own.status();
  EXPECT_GE(own->capacity, 1000u);
  std::memcpy(own->data, "shared bytes", 12);
  absl::StatusOr<SharedSegments::Peer> peer =
      segments.MapPeer(getpid(), own->fd, own->id, 1000);
  ASSERT_TRUE(peer.ok()) << peer.status();
  EXPECT_EQ(std::memcmp(peer->data, "shared bytes", 12), 0);
  // Later writes show through the peer's mapping too.
  std::memcpy(own->data, "SHARED", 6);
  EXPECT_EQ(std::memcmp(peer->data, "SHARED bytes", 12), 0);
  segments.Unmap(*peer);
  segments.Release(*own);
}

TEST(SharedSegmentsTest, Acquire_AfterRelease_ReusesTheSegment) {
  SharedSegments& segments = SharedSegments::Get();
  absl::StatusOr<SharedSegments::Own> first = segments.Acquire(3 << 20);
  ASSERT_TRUE(first.ok());
  const uint64_t id = first->id;
  segments.Release(*first);
  absl::StatusOr<SharedSegments::Own> second = segments.Acquire(1 << 20);
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(second->id, id);
  // One leased at a time: a second lease gets another segment.
  absl::StatusOr<SharedSegments::Own> third = segments.Acquire(1 << 20);
  ASSERT_TRUE(third.ok());
  EXPECT_NE(third->id, id);
  segments.Release(*second);
  segments.Release(*third);
}

TEST(SharedSegmentsTest, MapPeer_WrongIdSizeOrDescriptor_Unavailable) {
  SharedSegments& segments = SharedSegments::Get();
  absl::StatusOr<SharedSegments::Own> own = segments.Acquire(4096);
  ASSERT_TRUE(own.ok());
  EXPECT_EQ(
      segments.MapPeer(getpid(), own->fd, own->id + 2, 4096).status().code(),
      absl::StatusCode::kUnavailable);
  EXPECT_EQ(segments.MapPeer(getpid(), own->fd, own->id, own->capacity + 1)
                .status()
                .code(),
            absl::StatusCode::kUnavailable);
  // A mapping already made is found by owner and id; an id not seen before
  // needs a descriptor that opens.
  const uint64_t unseen = own->id + 2;
  EXPECT_EQ(segments.MapPeer(getpid(), 987654, unseen, 16).status().code(),
            absl::StatusCode::kUnavailable);
  // Not a segment at all: too small to hold a header and the bytes.
  EXPECT_EQ(
      segments.MapPeer(getpid(), STDIN_FILENO, unseen, 16).status().code(),
      absl::StatusCode::kUnavailable);
  segments.Release(*own);
}

}  // namespace
}  // namespace chorus
