// CallFrameParser: frames cut from bytes that arrive in pieces of any size,
// the size limit, and Reset().

#include "common/call_frame.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace chorus {
namespace {

TEST(CallFrameTest, Next_BytesInAnyPieces_SameFrames) {
  const std::vector<std::string> payloads = {"", "a", std::string(300, 'x'),
                                             std::string(70000, 'y')};
  std::string stream;
  for (const std::string& p : payloads) AppendCallFrame(p, &stream);
  for (size_t piece : {size_t{1}, size_t{3}, size_t{4096}, stream.size()}) {
    CallFrameParser parser(1 << 20);
    std::vector<std::string> got;
    for (size_t at = 0; at < stream.size(); at += piece) {
      parser.Append(absl::string_view(stream).substr(at, piece));
      std::string payload;
      while (true) {
        absl::StatusOr<bool> next = parser.Next(&payload);
        ASSERT_TRUE(next.ok()) << next.status();
        if (!*next) break;
        got.push_back(payload);
      }
    }
    EXPECT_EQ(got, payloads) << "pieces of " << piece;
    EXPECT_EQ(parser.buffered(), 0u);
  }
}

TEST(CallFrameTest, Next_FrameOverLimit_ResourceExhaustedUntilReset) {
  CallFrameParser parser(10);
  std::string stream;
  AppendCallFrame(std::string(11, 'z'), &stream);
  parser.Append(stream);
  std::string payload;
  EXPECT_EQ(parser.Next(&payload).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(parser.Next(&payload).status().code(),
            absl::StatusCode::kResourceExhausted);
  parser.Reset();
  std::string ok;
  AppendCallFrame("fine", &ok);
  parser.Append(ok);
  absl::StatusOr<bool> next = parser.Next(&payload);
  ASSERT_TRUE(next.ok() && *next);
  EXPECT_EQ(payload, "fine");
}

TEST(CallFrameTest, AppendCallFrame_LittleEndianLength) {
  std::string frame;
  AppendCallFrame(std::string(0x0102, 'q'), &frame);
  ASSERT_EQ(frame.size(), 4u + 0x0102);
  EXPECT_EQ(frame.substr(0, 4), std::string("\x02\x01\x00\x00", 4));
}

}  // namespace
}  // namespace chorus
