// The data plane over real sockets on 127.0.0.1: a receiving worker's
// TcpListener feeds an Inbox (its PeerService, in a gRPC server, tells where
// the listener is); a TcpPeerPool sends to it over TCP wire frames. Also
// what the receiver does with connections that end without a goodbye, that
// send malformed frames, or whose data it cannot take yet.
#include <grpcpp/server.h>

#include <memory>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/net.h"
#include "common/tcp_socket.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/worker/dataplane/inbox.h"
#include "server/worker/dataplane/peer_service.h"
#include "server/worker/dataplane/tcp_listener.h"
#include "server/worker/dataplane/tcp_peer_pool.h"
#include "server/worker/dataplane/wire_frame.h"

namespace chorus {
namespace {

using ::testing::HasSubstr;

// Generous: these waits end on events, the deadline only bounds a failure.
constexpr absl::Duration kWait = absl::Seconds(30);

MessageKey Key(uint32_t tag, const std::string& group = "g") {
  MessageKey key;
  key.group = group;
  key.epoch = 1;
  key.sequence = 1;
  key.from_rank = 0;
  key.to_rank = 1;
  key.tag = tag;
  return key;
}

std::string Pattern(size_t size, int seed) {
  std::string out(size, '\0');
  for (size_t i = 0; i < size; ++i) {
    out[i] = static_cast<char>((i * 131 + seed * 7) & 0xff);
  }
  return out;
}

// A receiving worker's data plane: inbox, TCP listener and gRPC service.
class Receiver {
 public:
  explicit Receiver(uint64_t stream_limit = 64 << 20) : inbox_(stream_limit) {
    absl::StatusOr<std::unique_ptr<TcpListener>> listener =
        TcpListener::Start("127.0.0.1", 0, &inbox_);
    EXPECT_TRUE(listener.ok()) << listener.status();
    listener_ = *std::move(listener);
    service_ = std::make_unique<PeerService>(listener_->port());
    ServerOptions options;
    options.listen_address = "127.0.0.1:0";
    options.services = {service_.get()};
    absl::StatusOr<StartedServer> server = StartServer(options);
    EXPECT_TRUE(server.ok()) << server.status();
    server_ = std::move(server->server);
    address_ = absl::StrCat("127.0.0.1:", server->port);
  }

  ~Receiver() {
    server_->Shutdown(DeadlineAfter(absl::Seconds(1)));
    listener_->Shutdown();
  }

  Inbox& inbox() { return inbox_; }
  TcpListener& listener() { return *listener_; }
  const std::string& address() const { return address_; }

 private:
  Inbox inbox_;
  std::unique_ptr<TcpListener> listener_;
  std::unique_ptr<PeerService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
};

// Opens a raw connection to the receiver's TCP data plane.
int RawConnection(Receiver& receiver) {
  absl::StatusOr<int> fd =
      ConnectTcp("127.0.0.1", receiver.listener().port(), absl::Now() + kWait);
  EXPECT_TRUE(fd.ok()) << fd.status();
  return fd.ok() ? *fd : -1;
}

absl::Status WriteRaw(int fd, absl::string_view bytes) {
  return WriteAll(fd, &bytes, 1, absl::Now() + kWait);
}

std::string Frame(const MessageKey& key, absl::string_view payload) {
  return *EncodeFrameHeader(key, payload.size()) + std::string(payload);
}

TEST(TcpDataPlaneTest, Send_MessagesOfEverySize_ArriveIntactUnderTheirKeys) {
  Receiver receiver;
  TcpPeerPool pool;
  const size_t sizes[] = {0, 1, 48, 65536, 8 << 20};
  for (uint32_t tag = 0; tag < 5; ++tag) {
    ASSERT_TRUE(pool.Send(receiver.address(), Key(tag),
                          Pattern(sizes[tag], tag), absl::Now() + kWait)
                    .ok());
  }
  // Taken in another order than sent: keys, not arrival, decide.
  for (uint32_t tag : {4u, 0u, 3u, 1u, 2u}) {
    absl::StatusOr<std::string> data =
        receiver.inbox().Take(Key(tag), absl::Now() + kWait);
    ASSERT_TRUE(data.ok()) << data.status();
    EXPECT_TRUE(*data == Pattern(sizes[tag], tag)) << "tag " << tag;
  }
}

TEST(TcpDataPlaneTest, PoolShutdown_SaysGoodbye_GroupNotMarkedLost) {
  Receiver receiver;
  {
    TcpPeerPool pool;
    ASSERT_TRUE(
        pool.Send(receiver.address(), Key(0), "x", absl::Now() + kWait).ok());
    pool.Shutdown();
  }
  ASSERT_TRUE(receiver.inbox().Take(Key(0), absl::Now() + kWait).ok());
  // A lost peer would end this wait at once with UNAVAILABLE.
  EXPECT_EQ(receiver.inbox()
                .Take(Key(1), absl::Now() + absl::Milliseconds(300))
                .status()
                .code(),
            absl::StatusCode::kDeadlineExceeded);
}

TEST(TcpDataPlaneTest, ConnectionDropped_WithoutGoodbye_WaitersLearnAtOnce) {
  Receiver receiver;
  const int fd = RawConnection(receiver);
  ASSERT_TRUE(WriteRaw(fd, kWireHello).ok());
  ASSERT_TRUE(WriteRaw(fd, Frame(Key(0), "first")).ok());
  ASSERT_TRUE(receiver.inbox().Take(Key(0), absl::Now() + kWait).ok());
  CloseSocket(fd);
  const absl::Time start = absl::Now();
  absl::StatusOr<std::string> next =
      receiver.inbox().Take(Key(1), absl::Now() + kWait);
  EXPECT_EQ(next.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(next.status().message(), HasSubstr("rank 0 of group g is gone"));
  EXPECT_LT(absl::Now() - start, kWait / 2);
}

TEST(TcpDataPlaneTest, FrameCutShort_GroupMarkedLost) {
  Receiver receiver;
  const int fd = RawConnection(receiver);
  ASSERT_TRUE(WriteRaw(fd, kWireHello).ok());
  ASSERT_TRUE(WriteRaw(fd, Frame(Key(0), "whole")).ok());
  const std::string cut = Frame(Key(1), Pattern(1000, 1)).substr(0, 500);
  ASSERT_TRUE(WriteRaw(fd, cut).ok());
  CloseSocket(fd);
  EXPECT_TRUE(receiver.inbox().Take(Key(0), absl::Now() + kWait).ok());
  EXPECT_EQ(receiver.inbox().Take(Key(1), absl::Now() + kWait).status().code(),
            absl::StatusCode::kUnavailable);
}

TEST(TcpDataPlaneTest, MalformedFrameOrHello_Dropped_ListenerKeepsServing) {
  Receiver receiver;
  const int wrong_hello = RawConnection(receiver);
  ASSERT_TRUE(WriteRaw(wrong_hello, "GET / HTTP/1.1\r\n\r\n").ok());
  std::string bad = Frame(Key(0, "bad"), "payload");
  bad[0] = 'X';
  const int bad_frame = RawConnection(receiver);
  ASSERT_TRUE(WriteRaw(bad_frame, kWireHello).ok());
  ASSERT_TRUE(WriteRaw(bad_frame, bad).ok());
  // The receiver closes both: reads see the end of the stream.
  char byte;
  EXPECT_FALSE(ReadFull(wrong_hello, &byte, 1));
  EXPECT_FALSE(ReadFull(bad_frame, &byte, 1));
  CloseSocket(wrong_hello);
  CloseSocket(bad_frame);

  TcpPeerPool pool;
  ASSERT_TRUE(
      pool.Send(receiver.address(), Key(0), "good", absl::Now() + kWait).ok());
  absl::StatusOr<std::string> data =
      receiver.inbox().Take(Key(0), absl::Now() + kWait);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(*data, "good");
}

// Sends `count` messages (tags 0..count-1) of `size(tag)` bytes from
// another thread while this one takes them in order, polling long before it
// blocks, so that it reads small frames off the socket itself; returns how
// many arrived intact.
template <typename Size>
int SendWhileTaking(Receiver& receiver, int count, Size size) {
  receiver.inbox().SetSpin(absl::Seconds(1));
  TcpPeerPool pool;
  std::thread sender([&] {
    for (int tag = 0; tag < count; ++tag) {
      ASSERT_TRUE(pool.Send(receiver.address(), Key(tag),
                            Pattern(size(tag), tag), absl::Now() + kWait)
                      .ok());
    }
  });
  int intact = 0;
  for (int tag = 0; tag < count; ++tag) {
    absl::StatusOr<std::string> data =
        receiver.inbox().Take(Key(tag), absl::Now() + kWait);
    if (!data.ok()) {
      ADD_FAILURE() << "tag " << tag << ": " << data.status();
      break;
    }
    if (*data == Pattern(size(tag), tag)) ++intact;
  }
  sender.join();
  return intact;
}

TEST(TcpDataPlaneTest, WaitingRank_SmallAndLargeFramesMixed_AllArriveIntact) {
  Receiver receiver;
  auto size = [](int tag) -> size_t {
    return tag % 10 == 9 ? (200 << 10) : (tag % 3) * 700;
  };
  EXPECT_EQ(SendWhileTaking(receiver, 300, size), 300);
}

TEST(TcpDataPlaneTest, WaitingRank_ReadsPastItsShare_StreamResumesOnTake) {
  // Every message takes the stream over its share of the inbox.
  Receiver receiver(/*stream_limit=*/64);
  EXPECT_EQ(SendWhileTaking(receiver, 200, [](int) -> size_t { return 100; }),
            200);
}

TEST(TcpDataPlaneTest, ReceiverHoldsBack_SenderWaitsThenMeetsItsDeadline) {
  // Untaken data over 1 MiB stops the connection's reader.
  Receiver receiver(/*stream_limit=*/1 << 20);
  TcpPeerPool pool;
  ASSERT_TRUE(pool.Send(receiver.address(), Key(0), Pattern(2 << 20, 0),
                        absl::Now() + kWait)
                  .ok());
  // More than the socket buffers hold: cannot all leave while held back.
  const absl::Status blocked =
      pool.Send(receiver.address(), Key(1), Pattern(64 << 20, 1),
                absl::Now() + absl::Seconds(1));
  EXPECT_EQ(blocked.code(), absl::StatusCode::kDeadlineExceeded) << blocked;
  // The held message is still there. The frame cut short at the deadline
  // marks its group epoch lost; the connection is reopened for the next
  // message.
  EXPECT_TRUE(receiver.inbox().Take(Key(0), absl::Now() + kWait).ok());
  EXPECT_EQ(receiver.inbox().Take(Key(1), absl::Now() + kWait).status().code(),
            absl::StatusCode::kUnavailable);
  ASSERT_TRUE(pool.Send(receiver.address(), Key(0, "next"), "after",
                        absl::Now() + kWait)
                  .ok());
  absl::StatusOr<std::string> after =
      receiver.inbox().Take(Key(0, "next"), absl::Now() + kWait);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(*after, "after");
}

TEST(TcpDataPlaneTest, PoolShutdown_WhileSendIsStuck_SendEndsUnavailable) {
  Receiver receiver(/*stream_limit=*/1 << 20);
  TcpPeerPool pool;
  ASSERT_TRUE(pool.Send(receiver.address(), Key(0), Pattern(2 << 20, 0),
                        absl::Now() + kWait)
                  .ok());
  absl::Status stuck;
  absl::Notification ended;
  std::thread sender([&] {
    // Held back by the receiver: waits for room until the deadline.
    stuck = pool.Send(receiver.address(), Key(1), Pattern(64 << 20, 1),
                      absl::Now() + kWait);
    ended.Notify();
  });
  // Shutdown ends the wait whether it comes before or during the send.
  pool.Shutdown();
  EXPECT_TRUE(ended.WaitForNotificationWithTimeout(kWait / 2));
  sender.join();
  EXPECT_EQ(stuck.code(), absl::StatusCode::kUnavailable) << stuck;
}

TEST(TcpDataPlaneTest, AbortGroup_WhileSendIsStuck_SendEndsAbortedPoolUsable) {
  Receiver receiver(/*stream_limit=*/1 << 20);
  TcpPeerPool pool;
  ASSERT_TRUE(pool.Send(receiver.address(), Key(0), Pattern(2 << 20, 0),
                        absl::Now() + kWait)
                  .ok());
  absl::Status stuck;
  absl::Notification ended;
  std::thread sender([&] {
    // Held back by the receiver: waits for room until the deadline.
    stuck = pool.Send(receiver.address(), Key(1), Pattern(64 << 20, 1),
                      absl::Now() + kWait);
    ended.Notify();
  });
  // Another group's abort leaves the send alone.
  pool.AbortGroup("other", 1);
  EXPECT_FALSE(ended.WaitForNotificationWithTimeout(absl::Milliseconds(200)));
  // An abort before the send started writing cuts nothing: repeat until
  // one lands while it writes.
  const absl::Time give_up = absl::Now() + kWait / 2;
  do {
    pool.AbortGroup("g", 1);
  } while (!ended.WaitForNotificationWithTimeout(absl::Milliseconds(100)) &&
           absl::Now() < give_up);
  ASSERT_TRUE(ended.HasBeenNotified());
  sender.join();
  EXPECT_EQ(stuck.code(), absl::StatusCode::kAborted) << stuck;
  EXPECT_THAT(std::string(stuck.message()), HasSubstr("group g was aborted"));
  // A later send of the aborted group epoch is refused at once.
  const absl::Status later =
      pool.Send(receiver.address(), Key(2), "late", absl::Now() + kWait);
  EXPECT_EQ(later.code(), absl::StatusCode::kAborted) << later;
  // The held message is still there (taking it lets a connection that was
  // refused before it wrote anything be read again). The next message goes
  // on a new connection where the send was cut, else on the same one.
  EXPECT_TRUE(receiver.inbox().Take(Key(0), absl::Now() + kWait).ok());
  ASSERT_TRUE(pool.Send(receiver.address(), Key(0, "next"), "after",
                        absl::Now() + kWait)
                  .ok());
  absl::StatusOr<std::string> after =
      receiver.inbox().Take(Key(0, "next"), absl::Now() + kWait);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(*after, "after");
}

TEST(TcpDataPlaneTest, ListenerShutdown_WhileHoldingBack_ReturnsPromptly) {
  Receiver receiver(/*stream_limit=*/1);
  TcpPeerPool pool;
  ASSERT_TRUE(
      pool.Send(receiver.address(), Key(0), "xy", absl::Now() + kWait).ok());
  // The reader now waits for the inbox; Shutdown must end that wait.
  const absl::Time start = absl::Now();
  receiver.listener().Shutdown();
  EXPECT_LT(absl::Now() - start, kWait / 2);
}

TEST(TcpDataPlaneTest, PeerGone_SendFailsUnavailableNamingAddress) {
  std::string address;
  {
    Receiver receiver;
    address = receiver.address();
  }
  TcpPeerPool pool;
  const absl::Status sent =
      pool.Send(address, Key(0), "x", absl::Now() + kWait);
  EXPECT_EQ(sent.code(), absl::StatusCode::kUnavailable) << sent;
  EXPECT_THAT(sent.message(), HasSubstr(address));
}

// The data port a join taught the pool is used as is: the peer's gRPC port
// (here one nothing listens on) is never asked.
TEST(TcpDataPlaneTest, LearnPeer_DataPortKnown_ConnectsWithoutAskingThePeer) {
  Receiver receiver;
  const std::string address = "127.0.0.1:1";
  TcpPeerPool pool;
  PeerRegistration registration;
  registration.worker_id = 7;
  registration.incarnation = 1;
  registration.data_port = static_cast<uint32_t>(receiver.listener().port());
  pool.LearnPeer(address, registration);
  ASSERT_TRUE(pool.Send(address, Key(0), "direct", absl::Now() + kWait).ok());
  absl::StatusOr<std::string> data =
      receiver.inbox().Take(Key(0), absl::Now() + kWait);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(*data, "direct");
}

// A join that shows the address as another registration (the peer
// restarted, or was evicted and came back) closes the old connection at
// once; the next send opens a new one.
TEST(TcpDataPlaneTest,
     LearnPeer_NewIncarnation_OldConnectionClosedAndReplaced) {
  Receiver receiver;
  TcpPeerPool pool;
  PeerRegistration registration;
  registration.worker_id = 7;
  registration.incarnation = 1;
  registration.data_port = static_cast<uint32_t>(receiver.listener().port());
  pool.LearnPeer(receiver.address(), registration);
  ASSERT_TRUE(
      pool.Send(receiver.address(), Key(0), "old", absl::Now() + kWait).ok());
  ASSERT_TRUE(receiver.inbox().Take(Key(0), absl::Now() + kWait).ok());

  // Learning the same registration again keeps the connection.
  pool.LearnPeer(receiver.address(), registration);
  EXPECT_EQ(receiver.inbox()
                .Take(Key(1), absl::Now() + absl::Milliseconds(300))
                .status()
                .code(),
            absl::StatusCode::kDeadlineExceeded);

  registration.incarnation = 2;
  pool.LearnPeer(receiver.address(), registration);
  // Closed without a goodbye: the receiver learns at once.
  EXPECT_EQ(receiver.inbox().Take(Key(1), absl::Now() + kWait).status().code(),
            absl::StatusCode::kUnavailable);

  ASSERT_TRUE(
      pool.Send(receiver.address(), Key(0, "after"), "new", absl::Now() + kWait)
          .ok());
  absl::StatusOr<std::string> data =
      receiver.inbox().Take(Key(0, "after"), absl::Now() + kWait);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(*data, "new");
}

}  // namespace
}  // namespace chorus
