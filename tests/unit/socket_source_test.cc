// SocketSource: what a waiting rank may take from a data-plane socket
// without blocking (ReceiveWholeFrame), and that whatever it leaves, the
// connection's blocking reader reads whole. Over a local socket pair; the
// peer's writes are done before each check, so nothing depends on timing.

#include "server/worker/dataplane/socket_source.h"

#include <sys/socket.h>
#include <unistd.h>

#include <optional>
#include <string>

#include "absl/strings/string_view.h"
#include "gtest/gtest.h"
#include "server/worker/dataplane/wire_frame.h"

namespace chorus {
namespace {

using Intake = SocketSource::Intake;

MessageKey Key(uint32_t tag) {
  MessageKey key;
  key.group = "g";
  key.epoch = 2;
  key.sequence = 9;
  key.from_rank = 1;
  key.to_rank = 0;
  key.tag = tag;
  return key;
}

std::string Frame(uint32_t tag, size_t payload_bytes) {
  return *EncodeFrameHeader(Key(tag), payload_bytes) +
         std::string(payload_bytes, static_cast<char>('a' + tag));
}

class SocketSourceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, fds_), 0);
  }
  void TearDown() override {
    close(fds_[0]);
    if (fds_[1] >= 0) close(fds_[1]);
  }

  void Write(absl::string_view bytes) {
    ASSERT_EQ(write(fds_[1], bytes.data(), bytes.size()),
              static_cast<ssize_t>(bytes.size()));
  }
  void ClosePeer() {
    close(fds_[1]);
    fds_[1] = -1;
  }
  // Reads one frame as the connection's reader does; expects a message
  // with `tag` and `payload_bytes` bytes.
  void ExpectFrame(SocketSource& source, uint32_t tag, size_t payload_bytes) {
    MessageKey key;
    std::string data;
    std::optional<StreamEnd> end =
        ReadFrame(source, &key, &data, nullptr, nullptr);
    ASSERT_FALSE(end.has_value());
    EXPECT_EQ(key.ToString(), Key(tag).ToString());
    EXPECT_EQ(data, std::string(payload_bytes, static_cast<char>('a' + tag)));
  }

  int fds_[2] = {-1, -1};
};

TEST_F(SocketSourceTest, ReceiveWholeFrame_NothingSent_NothingYet) {
  SocketSource source(fds_[0], nullptr);
  EXPECT_EQ(source.ReceiveWholeFrame(), Intake::kNothingYet);
  EXPECT_FALSE(source.HasBuffered());
}

TEST_F(SocketSourceTest,
       ReceiveWholeFrame_HeaderInPart_NothingYetNothingTaken) {
  SocketSource source(fds_[0], nullptr);
  const std::string frame = Frame(1, 8);
  Write(frame.substr(0, 10));
  EXPECT_EQ(source.ReceiveWholeFrame(), Intake::kNothingYet);
  EXPECT_FALSE(source.HasBuffered());
  Write(frame.substr(10));
  EXPECT_EQ(source.ReceiveWholeFrame(), Intake::kWholeFrame);
  ExpectFrame(source, 1, 8);
}

TEST_F(SocketSourceTest, ReceiveWholeFrame_TwoSmallFrames_TakesOneAtATime) {
  SocketSource source(fds_[0], nullptr);
  Write(Frame(1, 8) + Frame(2, 1000));
  ASSERT_EQ(source.ReceiveWholeFrame(), Intake::kWholeFrame);
  ExpectFrame(source, 1, 8);
  EXPECT_FALSE(source.HasBuffered());
  ASSERT_EQ(source.ReceiveWholeFrame(), Intake::kWholeFrame);
  ExpectFrame(source, 2, 1000);
  EXPECT_EQ(source.ReceiveWholeFrame(), Intake::kNothingYet);
}

TEST_F(SocketSourceTest,
       ReceiveWholeFrame_PayloadInPart_LeftBufferedForReader) {
  SocketSource source(fds_[0], nullptr);
  const std::string frame = Frame(3, 4000);
  Write(frame.substr(0, 100));
  EXPECT_EQ(source.ReceiveWholeFrame(), Intake::kLeftToReader);
  EXPECT_TRUE(source.HasBuffered());
  // The reader's business from here on, even once the rest came.
  Write(frame.substr(100));
  EXPECT_EQ(source.ReceiveWholeFrame(), Intake::kLeftToReader);
  ExpectFrame(source, 3, 4000);
}

TEST_F(SocketSourceTest, ReceiveWholeFrame_FrameOverTheBuffer_LeftUntouched) {
  SocketSource source(fds_[0], nullptr);
  const std::string frame = Frame(4, SocketSource::kBufferBytes);
  Write(frame.substr(0, kFrameHeaderBytes + 100));
  EXPECT_EQ(source.ReceiveWholeFrame(), Intake::kLeftToReader);
  EXPECT_FALSE(source.HasBuffered());
  Write(frame.substr(kFrameHeaderBytes + 100));
  ExpectFrame(source, 4, SocketSource::kBufferBytes);
}

TEST_F(SocketSourceTest, ReceiveWholeFrame_GoodbyeOrEnd_LeftToReader) {
  SocketSource source(fds_[0], nullptr);
  Write(EncodeGoodbyeFrame());
  EXPECT_EQ(source.ReceiveWholeFrame(), Intake::kLeftToReader);
  MessageKey key;
  std::string data;
  EXPECT_EQ(ReadFrame(source, &key, &data, nullptr, nullptr),
            StreamEnd::kGoodbye);
  ClosePeer();
  EXPECT_EQ(source.ReceiveWholeFrame(), Intake::kLeftToReader);
  EXPECT_EQ(ReadFrame(source, &key, &data, nullptr, nullptr),
            StreamEnd::kClosed);
}

TEST_F(SocketSourceTest, ReceiveWholeFrame_MalformedHeader_LeftToReader) {
  SocketSource source(fds_[0], nullptr);
  Write(std::string(kFrameHeaderBytes, 'x'));
  EXPECT_EQ(source.ReceiveWholeFrame(), Intake::kLeftToReader);
  MessageKey key;
  std::string data;
  std::string why;
  EXPECT_EQ(ReadFrame(source, &key, &data, &why, nullptr),
            StreamEnd::kMalformed);
  EXPECT_FALSE(why.empty());
}

}  // namespace
}  // namespace chorus
