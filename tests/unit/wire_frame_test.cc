#include "server/worker/dataplane/wire_frame.h"

#include <string>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

using ::testing::HasSubstr;

MessageKey SampleKey() {
  MessageKey key;
  key.group = "trainers";
  key.epoch = 0x0102030405060708ull;
  key.sequence = 41;
  key.from_rank = 3;
  key.to_rank = 7;
  key.tag = 0xfffffffeu;
  return key;
}

TEST(WireFrameTest, EncodeThenDecode_SameFields) {
  absl::StatusOr<std::string> encoded = EncodeFrameHeader(SampleKey(), 12345);
  ASSERT_TRUE(encoded.ok()) << encoded.status();
  ASSERT_EQ(encoded->size(), kFrameHeaderBytes + 8);
  EXPECT_EQ(encoded->substr(kFrameHeaderBytes), "trainers");
  absl::StatusOr<FrameHeader> decoded =
      DecodeFrameHeader(encoded->substr(0, kFrameHeaderBytes));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_FALSE(decoded->goodbye);
  EXPECT_EQ(decoded->group_bytes, 8u);
  EXPECT_EQ(decoded->payload_bytes, 12345u);
  EXPECT_EQ(decoded->key.epoch, SampleKey().epoch);
  EXPECT_EQ(decoded->key.sequence, 41u);
  EXPECT_EQ(decoded->key.from_rank, 3);
  EXPECT_EQ(decoded->key.to_rank, 7);
  EXPECT_EQ(decoded->key.tag, 0xfffffffeu);
}

TEST(WireFrameTest, Encode_IsLittleEndian) {
  absl::StatusOr<std::string> encoded = EncodeFrameHeader(SampleKey(), 1);
  ASSERT_TRUE(encoded.ok());
  EXPECT_EQ(encoded->substr(0, 4), "CHRS");
  EXPECT_EQ((*encoded)[8], '\x08');   // lowest byte of the epoch first
  EXPECT_EQ((*encoded)[15], '\x01');  // highest byte last
  EXPECT_EQ((*encoded)[40], '\x01');  // payload length 1
}

TEST(WireFrameTest, Goodbye_DecodesAsGoodbye) {
  const std::string frame = EncodeGoodbyeFrame();
  ASSERT_EQ(frame.size(), kFrameHeaderBytes);
  absl::StatusOr<FrameHeader> decoded = DecodeFrameHeader(frame);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_TRUE(decoded->goodbye);
  EXPECT_EQ(decoded->group_bytes, 0u);
  EXPECT_EQ(decoded->payload_bytes, 0u);
}

TEST(WireFrameTest, Encode_GroupOverLimit_InvalidArgument) {
  MessageKey key = SampleKey();
  key.group.assign(kMaxFrameGroupBytes + 1, 'g');
  EXPECT_EQ(EncodeFrameHeader(key, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(WireFrameTest, Encode_PayloadOverLimit_InvalidArgument) {
  EXPECT_EQ(
      EncodeFrameHeader(SampleKey(), kMaxFramePayloadBytes + 1).status().code(),
      absl::StatusCode::kInvalidArgument);
}

TEST(WireFrameTest, Encode_NegativeRank_InvalidArgument) {
  MessageKey key = SampleKey();
  key.from_rank = -1;
  EXPECT_EQ(EncodeFrameHeader(key, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Returns a valid header with byte `offset` replaced by `value`.
std::string Corrupted(size_t offset, char value) {
  std::string header =
      EncodeFrameHeader(SampleKey(), 16)->substr(0, kFrameHeaderBytes);
  header[offset] = value;
  return header;
}

TEST(WireFrameTest, Decode_BadInput_InvalidArgumentSayingWhy) {
  struct Case {
    std::string name;
    std::string header;
    std::string says;
  };
  std::string huge_payload = Corrupted(47, '\x01');  // 2^56 bytes
  std::string huge_group = Corrupted(7, '\x10');     // 4096 + 8 bytes
  std::string negative_rank = Corrupted(27, '\x80');
  std::string goodbye_with_payload = EncodeGoodbyeFrame();
  goodbye_with_payload[40] = '\x01';
  const Case cases[] = {
      {"magic", Corrupted(0, 'X'), "bad magic"},
      {"version", Corrupted(4, '\x02'), "version 2"},
      {"flags", Corrupted(36, '\x02'), "unknown flags"},
      {"payload", huge_payload, "payload"},
      {"group", huge_group, "group name"},
      {"rank", negative_rank, "negative rank"},
      {"goodbye", goodbye_with_payload, "goodbye"},
      {"truncated", std::string(kFrameHeaderBytes - 1, '\0'), "truncated"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    absl::StatusOr<FrameHeader> decoded = DecodeFrameHeader(c.header);
    EXPECT_EQ(decoded.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(decoded.status().message(), HasSubstr(c.says));
  }
}

}  // namespace
}  // namespace chorus
