// The TCP data plane with TLS on, both ends in this process presenting
// worker w0's certificate: a sender delivers only to the worker the join
// named at the address (a listener with another worker's certificate gets
// nothing), and a listener flooded with connections that never finish
// their handshake keeps at most 64 of them and still serves a member.
#include <sys/socket.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/tcp_socket.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/worker/dataplane/inbox.h"
#include "server/worker/dataplane/peer_directory.h"
#include "server/worker/dataplane/tcp_listener.h"
#include "server/worker/dataplane/tcp_peer_pool.h"
#include "tests/testing/certs.h"

namespace chorus::test {
namespace {

using ::testing::HasSubstr;

// Generous: these waits end on events, the deadline only bounds a failure.
constexpr absl::Duration kWait = absl::Seconds(30);

// Rank 0 of group "g" epoch 1 sends to rank 1; w0 holds both.
MessageKey Key() {
  MessageKey key;
  key.group = "g";
  key.epoch = 1;
  key.sequence = 1;
  key.from_rank = 0;
  key.to_rank = 1;
  return key;
}

class DataPlaneTlsTest : public WorkerTlsSuite {
 protected:
  void SetUp() override {
    directory_.Learn("g", 1, {"w0", "w0"});
    absl::StatusOr<std::unique_ptr<TcpListener>> listener =
        TcpListener::Start("127.0.0.1", 0, &inbox_, &directory_);
    ASSERT_TRUE(listener.ok()) << listener.status();
    listener_ = *std::move(listener);
    address_ = "127.0.0.1:1";  // the gRPC port is never asked
  }

  // What a join says of the member at address_: worker `name`.
  PeerRegistration Member(const std::string& name) const {
    PeerRegistration registration;
    registration.worker_id = 1;
    registration.incarnation = 1;
    registration.data_port = static_cast<uint32_t>(listener_->port());
    registration.name = name;
    return registration;
  }

  PeerDirectory directory_;
  Inbox inbox_{64 << 20};
  std::unique_ptr<TcpListener> listener_;
  std::string address_;
};

TEST_F(DataPlaneTlsTest,
       Send_ListenerPresentsAnotherWorker_UnavailableNothingSent) {
  TcpPeerPool pool;
  pool.LearnPeer(address_, Member("w1"));
  const absl::Status sent =
      pool.Send(address_, Key(), "secret", absl::Now() + kWait);
  EXPECT_EQ(sent.code(), absl::StatusCode::kUnavailable) << sent;
  EXPECT_THAT(sent.message(), HasSubstr("chorus://worker/w0"));
  EXPECT_THAT(sent.message(), HasSubstr("not chorus://worker/w1"));
  EXPECT_TRUE(absl::IsDeadlineExceeded(
      inbox_.Take(Key(), absl::Now() + absl::Milliseconds(300)).status()));
}

TEST_F(DataPlaneTlsTest, Send_ListenerPresentsTheMember_Delivered) {
  TcpPeerPool pool;
  pool.LearnPeer(address_, Member("w0"));
  ASSERT_TRUE(pool.Send(address_, Key(), "data", absl::Now() + kWait).ok());
  absl::StatusOr<std::string> data = inbox_.Take(Key(), absl::Now() + kWait);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(*data, "data");
}

// 200 connections that never start their handshake: the oldest are closed
// as the 65th and later arrive (long before the 5 s handshake deadline),
// and a member's connection opened after them is served.
TEST_F(DataPlaneTlsTest,
       Accept_FloodOfSilentConnections_OldestClosedMemberServed) {
  const absl::Time start = absl::Now();
  std::vector<int> silent;
  for (int i = 0; i < 200; ++i) {
    absl::StatusOr<int> fd =
        ConnectTcp("127.0.0.1", listener_->port(), absl::Now() + kWait);
    ASSERT_TRUE(fd.ok()) << fd.status();
    silent.push_back(*fd);
  }
  // The first is closed by the listener (its read ends with no bytes).
  char byte;
  EXPECT_TRUE(absl::IsUnavailable(
      ReadSome(silent[0], &byte, 1, absl::Now() + kWait, -1).status()));
  // The newest is still open: the first was dropped for the cap, not at
  // its handshake deadline (checked while that deadline cannot have come).
  const absl::Status newest =
      ReadSome(silent.back(), &byte, 1, absl::Now() + absl::Milliseconds(100),
               -1)
          .status();
  if (absl::Now() - start < absl::Seconds(4)) {
    EXPECT_TRUE(absl::IsDeadlineExceeded(newest)) << newest;
  }
  TcpPeerPool pool;
  pool.LearnPeer(address_, Member("w0"));
  ASSERT_TRUE(pool.Send(address_, Key(), "data", absl::Now() + kWait).ok());
  EXPECT_TRUE(inbox_.Take(Key(), absl::Now() + kWait).ok());
  for (int fd : silent) CloseSocket(fd);
}

}  // namespace
}  // namespace chorus::test
