// PayloadBuffers: what it keeps and hands out again, its limits, and a frame
// stream reading a payload into a kept buffer of its size.
#include "server/worker/dataplane/payload_buffers.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "server/worker/dataplane/frame_reader.h"
#include "server/worker/dataplane/wire_frame.h"

namespace chorus {
namespace {

constexpr size_t kLarge = PayloadBuffers::kMinPooledBytes;

TEST(PayloadBuffersTest, Take_NothingKept_FalseAndOutUntouched) {
  PayloadBuffers buffers;
  std::string out = "left alone";
  EXPECT_FALSE(buffers.Take(kLarge, &out));
  EXPECT_EQ(out, "left alone");
}

TEST(PayloadBuffersTest, Take_AfterGiveOfThatSize_TheSameBuffer) {
  PayloadBuffers buffers;
  std::string given(kLarge, 'a');
  const char* memory = given.data();
  buffers.Give(std::move(given));
  EXPECT_EQ(buffers.kept_bytes(), kLarge);
  std::string out;
  EXPECT_FALSE(buffers.Take(kLarge + 1, &out));
  ASSERT_TRUE(buffers.Take(kLarge, &out));
  EXPECT_EQ(out.data(), memory);
  EXPECT_EQ(out.size(), kLarge);
  EXPECT_EQ(buffers.kept_bytes(), 0u);
  EXPECT_FALSE(buffers.Take(kLarge, &out));
}

TEST(PayloadBuffersTest, Give_SmallBuffer_NotKept) {
  PayloadBuffers buffers;
  buffers.Give(std::string(kLarge - 1, 'a'));
  std::string out;
  EXPECT_FALSE(buffers.Take(kLarge - 1, &out));
  EXPECT_EQ(buffers.kept_bytes(), 0u);
}

TEST(PayloadBuffersTest, Give_OverTheLimits_Dropped) {
  PayloadBuffers buffers;
  for (size_t i = 0; i < PayloadBuffers::kMaxPerSize + 3; ++i) {
    buffers.Give(std::string(kLarge, 'a'));
  }
  EXPECT_EQ(buffers.kept_bytes(), PayloadBuffers::kMaxPerSize * kLarge);
  // Buffers of other sizes (1 MiB and a bit more each) fill the rest, up
  // to the total.
  for (size_t i = 0; i < 64; ++i) {
    buffers.Give(std::string((1 << 20) + i * kLarge, 'b'));
  }
  EXPECT_LE(buffers.kept_bytes(), PayloadBuffers::kMaxPooledBytes);
  EXPECT_GT(buffers.kept_bytes(), PayloadBuffers::kMaxPooledBytes - (5 << 20));
}

TEST(PayloadBuffersTest, Give_FullOfSizesNotUsedSince_StalestMakeRoom) {
  PayloadBuffers buffers;
  constexpr size_t kChunk = 1 << 20;
  // The size every call uses, then sizes seen once each until full.
  buffers.Give(std::string(kChunk, 'c'));
  for (size_t i = 1; buffers.kept_bytes() + kChunk + i * kLarge <=
                     PayloadBuffers::kMaxPooledBytes;
       ++i) {
    buffers.Give(std::string(kChunk + i * kLarge, 'o'));
  }
  // Then exactly full (less than kLarge left over).
  const size_t gap = PayloadBuffers::kMaxPooledBytes - buffers.kept_bytes();
  if (gap >= kLarge) buffers.Give(std::string(gap, 'g'));
  ASSERT_GT(buffers.kept_bytes() + kLarge, PayloadBuffers::kMaxPooledBytes);
  // The common size is taken and given back: it is the freshest.
  std::string out;
  ASSERT_TRUE(buffers.Take(kChunk, &out));
  buffers.Give(std::move(out));
  // A second buffer of it still finds room: the stalest odd size goes.
  const size_t before = buffers.kept_bytes();
  buffers.Give(std::string(kChunk, 'c'));
  EXPECT_LE(buffers.kept_bytes(), PayloadBuffers::kMaxPooledBytes);
  EXPECT_GT(buffers.kept_bytes(), before - (2 * kChunk));
  std::string first;
  std::string second;
  EXPECT_TRUE(buffers.Take(kChunk, &first));
  EXPECT_TRUE(buffers.Take(kChunk, &second));
  // The first odd size, given longest ago, was freed.
  EXPECT_FALSE(buffers.Take(kChunk + kLarge, &out));
  // A buffer larger than the whole pool is never kept.
  buffers.Give(std::string(PayloadBuffers::kMaxPooledBytes + 1, 'x'));
  EXPECT_LE(buffers.kept_bytes(), PayloadBuffers::kMaxPooledBytes);
}

// Bytes of a string, read in order.
class StringSource final : public ByteSource {
 public:
  explicit StringSource(std::string bytes) : bytes_(std::move(bytes)) {}
  bool Read(char* out, size_t size) override {
    if (bytes_.size() - at_ < size) return false;
    bytes_.copy(out, size, at_);
    at_ += size;
    return true;
  }

 private:
  std::string bytes_;
  size_t at_ = 0;
};

TEST(PayloadBuffersTest,
     ReadFrameStream_KeptBufferOfTheSize_PayloadReadIntoIt) {
  MessageKey key;
  key.group = "g";
  key.epoch = 1;
  const std::string payload(kLarge, 'p');
  absl::StatusOr<std::string> header = EncodeFrameHeader(key, payload.size());
  ASSERT_TRUE(header.ok()) << header.status();
  StringSource source(std::string(kWireHello) + *header + payload + *header +
                      payload + EncodeGoodbyeFrame());
  PayloadBuffers buffers;
  std::string kept(kLarge, 'k');
  const char* memory = kept.data();
  buffers.Give(std::move(kept));
  std::vector<std::string> got;
  std::vector<const char*> memories;
  const StreamEnd end = ReadFrameStream(
      source,
      [&](MessageKey, std::string data) {
        memories.push_back(data.data());
        got.push_back(std::move(data));
        return true;
      },
      nullptr, &buffers);
  EXPECT_EQ(end, StreamEnd::kGoodbye);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0], payload);
  EXPECT_EQ(got[1], payload);
  // The first went into the kept buffer; none was left for the second.
  EXPECT_EQ(memories[0], memory);
  EXPECT_NE(memories[1], memory);
}

}  // namespace
}  // namespace chorus
