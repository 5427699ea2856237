// Unit tests of FrameServer over loopback TCP: replies the handler sends on
// the serving thread while it takes a read's frames (to the calling
// connection and to others) all arrive, in the order sent, once the read's
// frames are taken; replies from other threads go out at once; a server
// that polls before blocking answers every frame.

#include "common/frame_server.h"

#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/call_frame.h"
#include "common/tcp_socket.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

// Generous: every wait ends on an event; the deadline only bounds a failure.
constexpr absl::Duration kWait = absl::Seconds(30);

// A connected client: writes frames, reads the replies' payloads.
class Client {
 public:
  explicit Client(int port) {
    absl::StatusOr<int> fd = ConnectTcp("127.0.0.1", port, absl::Now() + kWait);
    EXPECT_TRUE(fd.ok()) << fd.status();
    fd_ = fd.ok() ? *fd : -1;
  }
  ~Client() { CloseSocket(fd_); }

  // Sends the hello (when `hello`) and one frame per payload, in one write.
  void Send(const std::vector<std::string>& payloads, bool hello) {
    std::string bytes = hello ? std::string(kCallHello) : "";
    for (const std::string& payload : payloads) {
      AppendCallFrame(payload, &bytes);
    }
    const absl::string_view part = bytes;
    ASSERT_TRUE(WriteAll(fd_, &part, 1, absl::Now() + kWait, -1).ok());
  }

  // Reads `count` reply payloads (fewer if the deadline passes).
  std::vector<std::string> Read(size_t count) {
    std::vector<std::string> replies;
    CallFrameParser frames(1 << 20);
    char buffer[4096];
    std::string payload;
    const absl::Time deadline = absl::Now() + kWait;
    while (replies.size() < count) {
      absl::StatusOr<size_t> got =
          ReadSome(fd_, buffer, sizeof(buffer), deadline, -1);
      if (!got.ok() || *got == 0) break;
      frames.Append(absl::string_view(buffer, *got));
      while (frames.Next(&payload).value_or(false)) {
        replies.push_back(payload);
      }
    }
    return replies;
  }

 private:
  int fd_ = -1;
};

// A call-frame server's options, named "test".
FrameServer::Options TestOptions() {
  FrameServer::Options options;
  options.name = "test";
  options.hello = std::string(kCallHello);
  options.max_frame_bytes = 1 << 20;
  options.error_payload = [](const absl::Status& why) {
    return std::string(why.message());
  };
  return options;
}

TEST(FrameServerTest,
     TakeFrames_HandlerRepliesToTwoConnections_EveryReplyArrivesInOrder) {
  absl::StatusOr<Listener> listener = ListenTcp("127.0.0.1", 0);
  ASSERT_TRUE(listener.ok()) << listener.status();
  absl::Mutex mu;
  // The first connection that sent "watch": it gets a copy of every reply.
  std::optional<FrameServer::Replier> watcher;
  FrameServer::Options options = TestOptions();
  absl::StatusOr<std::unique_ptr<FrameServer>> server = FrameServer::Start(
      listener->fd, options,
      [&](std::string payload, FrameServer::Replier reply, const Identity*) {
        absl::MutexLock lock(&mu);
        if (payload == "watch") {
          watcher = reply;
          reply.Send("watching");
          return true;
        }
        reply.Send(absl::StrCat("a", payload));
        reply.Send(absl::StrCat("b", payload));
        if (watcher.has_value()) watcher->Send(absl::StrCat("w", payload));
        return true;
      });
  ASSERT_TRUE(server.ok()) << server.status();
  Client watching(listener->port);
  watching.Send({"watch"}, true);
  ASSERT_EQ(watching.Read(1), std::vector<std::string>({"watching"}));

  Client calling(listener->port);
  std::vector<std::string> payloads;
  std::vector<std::string> expected;
  std::vector<std::string> watched;
  for (int i = 0; i < 200; ++i) {
    payloads.push_back(absl::StrCat(i));
    expected.push_back(absl::StrCat("a", i));
    expected.push_back(absl::StrCat("b", i));
    watched.push_back(absl::StrCat("w", i));
  }
  calling.Send(payloads, true);
  EXPECT_EQ(calling.Read(expected.size()), expected);
  EXPECT_EQ(watching.Read(watched.size()), watched);

  // From another thread, a reply goes out at once.
  std::thread([&] {
    absl::MutexLock lock(&mu);
    watcher->Send("later");
  }).join();
  EXPECT_EQ(watching.Read(1), std::vector<std::string>({"later"}));
  (*server)->Shutdown();
}

TEST(FrameServerTest, Serve_PollingBeforeBlocking_EveryFrameAnswered) {
  absl::StatusOr<Listener> listener = ListenTcp("127.0.0.1", 0);
  ASSERT_TRUE(listener.ok()) << listener.status();
  FrameServer::Options options = TestOptions();
  options.spin = absl::Microseconds(50);
  absl::StatusOr<std::unique_ptr<FrameServer>> server = FrameServer::Start(
      listener->fd, options,
      [](std::string payload, FrameServer::Replier reply, const Identity*) {
        reply.Send(absl::StrCat("a", payload));
        return true;
      });
  ASSERT_TRUE(server.ok()) << server.status();
  // One frame at a time: some come while the serving thread polls, some
  // after it blocked again.
  Client calling(listener->port);
  for (int i = 0; i < 200; ++i) {
    calling.Send({absl::StrCat(i)}, i == 0);
    ASSERT_EQ(calling.Read(1),
              std::vector<std::string>({absl::StrCat("a", i)}));
  }
  // A second connection is served beside the first.
  Client other(listener->port);
  other.Send({"x"}, true);
  EXPECT_EQ(other.Read(1), std::vector<std::string>({"ax"}));
  (*server)->Shutdown();
}

}  // namespace
}  // namespace chorus
