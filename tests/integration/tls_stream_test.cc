// TlsStream (common/tls_stream.h) over a real loopback TCP connection
// with both ends in this process, certificates from scripts/dev_certs.sh:
// frames of many records written in parts arrive whole and in order, a
// write to a peer that closed fails, one to a peer that stopped reading
// ends at its deadline, and a read that ends the session writes TLS's alert
// without raising SIGPIPE.

#include "common/tls_stream.h"

#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/tcp_socket.h"
#include "common/transport_security.h"
#include "gtest/gtest.h"
#include "tests/testing/certs.h"

namespace chorus::test {
namespace {

constexpr absl::Duration kWait = absl::Seconds(60);

// TLS is the process's: both ends present the coordinator's certificate,
// which names chorus://coordinator.
class TlsStreamTest : public CoordinatorTlsSuite {
 protected:
  void SetUp() override {
    absl::StatusOr<Listener> listener = ListenTcp("127.0.0.1", 0);
    ASSERT_TRUE(listener.ok()) << listener.status();
    listener_ = *listener;
  }

  void TearDown() override {
    shutdown(listener_.fd, SHUT_RDWR);  // ends an accept() still waiting
    if (accepting_.joinable()) accepting_.join();
    CloseSocket(listener_.fd);
    CloseSocket(client_fd_);
    CloseSocket(server_fd_);
  }

  // Connects a plain TCP client to the listener and accepts it: client_fd_
  // and server_fd_, no handshake yet.
  void ConnectRaw() {
    absl::StatusOr<int> fd =
        ConnectTcp("127.0.0.1", listener_.port, absl::Now() + kWait);
    ASSERT_TRUE(fd.ok()) << fd.status();
    client_fd_ = *fd;
    server_fd_ = accept(listener_.fd, nullptr, nullptr);
    ASSERT_GE(server_fd_, 0);
  }

  // Connects to the listener and runs both handshakes; `serve` then runs on
  // the accepting end's thread with its stream.
  std::unique_ptr<TlsStream> Connect(std::function<void(TlsStream&)> serve) {
    accepting_ = std::thread([this, serve = std::move(serve)] {
      server_fd_ = accept(listener_.fd, nullptr, nullptr);
      if (server_fd_ < 0) return;
      absl::StatusOr<std::unique_ptr<TlsStream>> server =
          TlsStream::Accept(server_fd_, absl::Now() + kWait);
      if (!server.ok()) {
        ADD_FAILURE() << server.status();
        return;
      }
      serve(**server);
    });
    absl::StatusOr<int> fd =
        ConnectTcp("127.0.0.1", listener_.port, absl::Now() + kWait);
    if (!fd.ok()) {
      ADD_FAILURE() << fd.status();
      return nullptr;
    }
    client_fd_ = *fd;
    absl::StatusOr<std::unique_ptr<TlsStream>> client =
        TlsStream::Connect(client_fd_, Role::kCoordinator, absl::Now() + kWait);
    if (!client.ok()) {
      ADD_FAILURE() << client.status();
      return nullptr;
    }
    EXPECT_EQ((*client)->peer().Uri(), "chorus://coordinator");
    return *std::move(client);
  }

  Listener listener_;
  std::thread accepting_;
  int client_fd_ = -1;
  int server_fd_ = -1;
};

TEST_F(TlsStreamTest, WriteAll_FramesOfManyRecords_ArriveWholeAndInOrder) {
  // Three frames, each a short header, 5 MiB and a tail: many sends of
  // buffered records, and records that span the parts.
  std::string data(5 << 20, '\0');
  for (size_t i = 0; i < data.size(); ++i) {
    data[i] = static_cast<char>((i * 131) >> 3);
  }
  const std::string header = "frame header of 37 bytes, give or take";
  std::string expected;
  for (int frame = 0; frame < 3; ++frame) {
    expected += header + data + absl::StrCat("tail ", frame);
  }
  std::string received(expected.size(), '\0');
  bool read_all = false;
  std::unique_ptr<TlsStream> client = Connect([&](TlsStream& server) {
    read_all = server.ReadFull(received.data(), received.size());
  });
  ASSERT_NE(client, nullptr);
  for (int frame = 0; frame < 3; ++frame) {
    const std::string tail = absl::StrCat("tail ", frame);
    const absl::string_view parts[3] = {header, data, tail};
    ASSERT_TRUE(client->WriteAll(parts, 3, absl::Now() + kWait).ok());
  }
  accepting_.join();
  ASSERT_TRUE(read_all);
  EXPECT_TRUE(received == expected) << "the bytes read differ";
}

TEST_F(TlsStreamTest, WriteAll_PeerClosed_Unavailable) {
  absl::Notification closed;
  std::unique_ptr<TlsStream> client = Connect([&](TlsStream&) {
    CloseSocket(server_fd_);
    server_fd_ = -1;
    closed.Notify();
  });
  ASSERT_NE(client, nullptr);
  closed.WaitForNotification();
  const std::string data(1 << 20, 'x');
  const absl::string_view part = data;
  absl::Status status;
  // The first megabytes may still fit the socket's buffers.
  for (int i = 0; i < 64 && status.ok(); ++i) {
    status = client->WriteAll(&part, 1, absl::Now() + kWait);
  }
  EXPECT_TRUE(absl::IsUnavailable(status)) << status;
  accepting_.join();  // before `closed` goes
}

TEST_F(TlsStreamTest, WriteAll_PeerStopsReading_DeadlineExceeded) {
  absl::Notification done;
  std::unique_ptr<TlsStream> client =
      Connect([&](TlsStream&) { done.WaitForNotificationWithTimeout(kWait); });
  ASSERT_NE(client, nullptr);
  // Far more than loopback's socket buffers hold.
  const std::string data(64 << 20, 'x');
  const absl::string_view part = data;
  const absl::Status status =
      client->WriteAll(&part, 1, absl::Now() + absl::Milliseconds(300));
  done.Notify();
  accepting_.join();  // before `done` goes
  EXPECT_TRUE(absl::IsDeadlineExceeded(status)) << status;
}

// A reading end whose own socket was shut down (as the data plane does when
// it closes a connection a reader thread still reads): the read ends, and
// the alert TLS writes then meets a socket closed for writing. That fails
// quietly instead of raising SIGPIPE, which ended chorusctl with exit code
// 141 after it had printed its result.
TEST_F(TlsStreamTest, ReadFull_OwnSocketShutDown_FalseWithoutSigpipe) {
  // The default disposition, as in a program that did not ignore SIGPIPE.
  struct sigaction previous;
  struct sigaction default_action = {};
  default_action.sa_handler = SIG_DFL;
  ASSERT_EQ(sigaction(SIGPIPE, &default_action, &previous), 0);
  bool read = true;
  std::unique_ptr<TlsStream> client = Connect([&](TlsStream& server) {
    shutdown(server_fd_, SHUT_RDWR);
    char byte;
    read = server.ReadFull(&byte, 1);
  });
  ASSERT_NE(client, nullptr);
  accepting_.join();
  sigaction(SIGPIPE, &previous, nullptr);
  EXPECT_FALSE(read);
}

// A client that sends its handshake one byte at a time, slower than the
// deadline allows, is refused at the deadline rather than after the last
// byte: the deadline holds for the whole handshake, not for each read.
TEST_F(TlsStreamTest, Accept_ClientTricklesBytes_DeadlineExceeded) {
  ASSERT_NO_FATAL_FAILURE(ConnectRaw());
  absl::Notification stop;
  std::thread trickle([&] {
    // The header of a 512-byte handshake record, then its body, a byte
    // every 50 ms.
    const char header[] = {0x16, 0x03, 0x01, 0x02, 0x00};
    for (size_t sent = 0;
         !stop.WaitForNotificationWithTimeout(absl::Milliseconds(50)); ++sent) {
      const char byte = sent < sizeof(header) ? header[sent] : 0;
      if (send(client_fd_, &byte, 1, MSG_NOSIGNAL) != 1) return;
    }
  });
  const absl::StatusOr<std::unique_ptr<TlsStream>> server =
      TlsStream::Accept(server_fd_, absl::Now() + absl::Milliseconds(400));
  stop.Notify();
  trickle.join();
  EXPECT_TRUE(absl::IsDeadlineExceeded(server.status())) << server.status();
}

// Shutting the socket down ends a handshake in progress at once (how the
// data plane drops the oldest unauthenticated connection).
TEST_F(TlsStreamTest, Accept_SocketShutDownMidHandshake_Unavailable) {
  ASSERT_NO_FATAL_FAILURE(ConnectRaw());
  absl::StatusOr<std::unique_ptr<TlsStream>> server;
  std::thread accepting(
      [&] { server = TlsStream::Accept(server_fd_, absl::Now() + kWait); });
  shutdown(server_fd_, SHUT_RDWR);
  accepting.join();
  EXPECT_TRUE(absl::IsUnavailable(server.status())) << server.status();
}

}  // namespace
}  // namespace chorus::test
