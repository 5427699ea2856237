// The chunked helpers the algorithms share: splitting element ranges into
// blocks and chunks, and Exchange() between two ranks of an in-process
// group (both directions, one side only, sizes 0, 1, odd and many chunks),
// the order it sends and receives in, and a chunk of the wrong size.
#include "server/worker/algorithms/chunked.h"

#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/worker/dataplane/in_process_transport.h"

namespace chorus {
namespace {

using ::testing::ElementsAre;

TEST(SplitRangeTest, CountNotDivisible_FirstPartsGetOneMore) {
  // 10 elements of 4 bytes in 3 parts: 4, 3, 3 elements.
  EXPECT_EQ(SplitRange(10, 4, 3, 0).offset, 0u);
  EXPECT_EQ(SplitRange(10, 4, 3, 0).size, 16u);
  EXPECT_EQ(SplitRange(10, 4, 3, 1).offset, 16u);
  EXPECT_EQ(SplitRange(10, 4, 3, 1).size, 12u);
  EXPECT_EQ(SplitRange(10, 4, 3, 2).offset, 28u);
  EXPECT_EQ(SplitRange(10, 4, 3, 2).size, 12u);
}

TEST(SplitRangeTest, FewerElementsThanParts_LastPartsEmpty) {
  EXPECT_EQ(SplitRange(2, 8, 4, 1).size, 8u);
  EXPECT_EQ(SplitRange(2, 8, 4, 2).size, 0u);
  EXPECT_EQ(SplitRange(2, 8, 4, 3).offset, 16u);
  EXPECT_EQ(SplitRange(0, 8, 4, 0).size, 0u);
}

TEST(ChunkTest, CountAndPieces_CoverTheRangeExactly) {
  EXPECT_EQ(ChunkCount(0, 8), 0u);
  EXPECT_EQ(ChunkCount(1, 8), 1u);
  EXPECT_EQ(ChunkCount(16, 8), 2u);
  EXPECT_EQ(ChunkCount(17, 8), 3u);
  const Range range{100, 17};
  EXPECT_EQ(ChunkOf(range, 8, 0).offset, 100u);
  EXPECT_EQ(ChunkOf(range, 8, 2).offset, 116u);
  EXPECT_EQ(ChunkOf(range, 8, 2).size, 1u);
}

TEST(ChunkTest, ElementChunkBytes_RoundsDownToWholeElementsAtLeastOne) {
  EXPECT_EQ(ElementChunkBytes(50, 4), 48u);
  EXPECT_EQ(ElementChunkBytes(48, 8), 48u);
  EXPECT_EQ(ElementChunkBytes(3, 8), 8u);
}

std::string Pattern(size_t size, int seed) {
  std::string out(size, '\0');
  for (size_t i = 0; i < size; ++i) {
    out[i] = static_cast<char>((i * 131 + seed * 7) & 0xff);
  }
  return out;
}

struct Received {
  absl::Status status;
  std::string bytes;
  std::vector<Range> chunks;
};

// Ranks 0 and 1 each send `sizes[r]` bytes to the other (none when
// negative) in chunks of `chunk`, and collect what they receive.
std::vector<Received> ExchangeBoth(const int sizes[2], uint64_t chunk) {
  InProcessHub hub("g", 2);
  std::vector<Received> got(2);
  auto run = [&](int rank) {
    const int peer = 1 - rank;
    InProcessTransport transport(&hub, rank, 1,
                                 absl::Now() + absl::Seconds(30));
    const std::string data = Pattern(sizes[rank] < 0 ? 0 : sizes[rank], rank);
    const int to = sizes[rank] < 0 ? -1 : peer;
    const int from = sizes[peer] < 0 ? -1 : peer;
    const Range recv{0, sizes[peer] < 0 ? 0u : uint64_t(sizes[peer])};
    Received& mine = got[rank];
    mine.bytes.resize(recv.size);
    mine.status =
        Exchange(transport, to, data.data(), Range{0, data.size()}, from, recv,
                 chunk, [&](const Range& piece, const std::string& bytes) {
                   mine.chunks.push_back(piece);
                   mine.bytes.replace(piece.offset, piece.size, bytes);
                   return absl::OkStatus();
                 });
  };
  std::thread other(run, 1);
  run(0);
  other.join();
  return got;
}

TEST(ExchangeTest, BothWays_EverySize_ArrivesWhole) {
  for (int a : {0, 1, 7, 100}) {
    for (int b : {0, 1, 33}) {
      const int sizes[2] = {a, b};
      const std::vector<Received> got = ExchangeBoth(sizes, 8);
      for (int r = 0; r < 2; ++r) {
        ASSERT_TRUE(got[r].status.ok()) << got[r].status;
        EXPECT_EQ(got[r].bytes, Pattern(sizes[1 - r], 1 - r))
            << "sizes " << a << ", " << b << ", rank " << r;
        EXPECT_EQ(got[r].chunks.size(), ChunkCount(sizes[1 - r], 8));
      }
    }
  }
}

TEST(ExchangeTest, OneWay_ChunksArriveInOrder) {
  const int sizes[2] = {20, -1};
  const std::vector<Received> got = ExchangeBoth(sizes, 8);
  ASSERT_TRUE(got[0].status.ok()) << got[0].status;
  ASSERT_TRUE(got[1].status.ok()) << got[1].status;
  EXPECT_TRUE(got[0].chunks.empty());
  std::vector<uint64_t> offsets;
  for (const Range& r : got[1].chunks) offsets.push_back(r.offset);
  EXPECT_THAT(offsets, ElementsAre(0u, 8u, 16u));
  EXPECT_EQ(got[1].bytes, Pattern(20, 0));
}

TEST(ExchangeTest, ChunkOfWrongSize_Internal) {
  InProcessHub hub("g", 2);
  InProcessTransport sender(&hub, 0, 1, absl::Now() + absl::Seconds(30));
  ASSERT_TRUE(sender.Send(1, "abc").ok());
  InProcessTransport receiver(&hub, 1, 1, absl::Now() + absl::Seconds(30));
  absl::Status status = Exchange(
      receiver, -1, nullptr, Range{}, 0, Range{0, 8}, 8,
      [](const Range&, const std::string&) { return absl::OkStatus(); });
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(status.message(), "rank 0 sent a chunk of 3 bytes; expected 8");
}

TEST(ExchangeTest, ChunkHandlerFails_ReturnsItsStatus) {
  InProcessHub hub("g", 2);
  InProcessTransport sender(&hub, 0, 1, absl::Now() + absl::Seconds(30));
  ASSERT_TRUE(sender.Send(1, "abcd").ok());
  InProcessTransport receiver(&hub, 1, 1, absl::Now() + absl::Seconds(30));
  absl::Status status = Exchange(receiver, -1, nullptr, Range{}, 0, Range{0, 4},
                                 8, [](const Range&, const std::string&) {
                                   return absl::DataLossError("bad chunk");
                                 });
  EXPECT_EQ(status, absl::DataLossError("bad chunk"));
}

}  // namespace
}  // namespace chorus
