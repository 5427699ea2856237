// A worker's call socket (worker.proto, LocalCallFrame) against real
// daemons, spoken as raw frames as a client in any language would: calls
// there run as Collective runs them (two ranks of one group each send
// hundreds of calls without waiting on one connection, and every reply
// comes under its call's id with the sum), the join announces the socket, a
// frame that does not parse is answered with call id 0 and the connection
// closed, and a daemon that stops ends the connection (after answering the
// call that waits, if it can, with UNAVAILABLE).
#include <fcntl.h>
#include <grpcpp/client_context.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "chorus/v1/worker.grpc.pb.h"
#include "common/call_frame.h"
#include "common/net.h"
#include "common/tcp_socket.h"
#include "common/transport_security.h"
#include "gtest/gtest.h"
#include "tests/testing/daemons.h"
#include "tests/testing/local_calls.h"

namespace chorus::test {
namespace {

constexpr absl::Duration kTimeout = absl::Seconds(60);
// Calls each rank sends before reading any reply.
constexpr int kPipelined = 300;

// A connection to a call socket that said the hello.
class CallConnection {
 public:
  // Connects to `path`; ok() says whether it did.
  explicit CallConnection(const std::string& path) {
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    if (path.size() >= sizeof(address.sun_path)) return;
    std::memcpy(address.sun_path, path.data(), path.size());
    fd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd_ < 0 || connect(fd_, reinterpret_cast<sockaddr*>(&address),
                           sizeof(address)) != 0) {
      Close();
      return;
    }
    fcntl(fd_, F_SETFL, fcntl(fd_, F_GETFL, 0) | O_NONBLOCK);
  }
  ~CallConnection() { Close(); }

  bool ok() const { return fd_ >= 0; }

  // Writes `bytes` as they are.
  absl::Status WriteRaw(absl::string_view bytes) {
    return WriteAll(fd_, &bytes, 1, absl::Now() + kTimeout);
  }

  // Writes the hello and then one frame of `payload`.
  absl::Status Send(absl::string_view payload) {
    std::string frame;
    if (!said_hello_) {
      frame = "CHORUS-LOCAL/1\n";
      said_hello_ = true;
    }
    AppendCallFrame(payload, &frame);
    return WriteRaw(frame);
  }

  // Reads the next reply; UNAVAILABLE when the daemon closed the
  // connection first.
  absl::StatusOr<v1::LocalCallReply> Read() {
    std::string payload;
    while (true) {
      absl::StatusOr<bool> next = frames_.Next(&payload);
      if (!next.ok()) return next.status();
      if (*next) break;
      char buffer[64 << 10];
      absl::StatusOr<size_t> n =
          ReadSome(fd_, buffer, sizeof(buffer), absl::Now() + kTimeout, -1);
      if (!n.ok()) return n.status();
      frames_.Append(absl::string_view(buffer, *n));
    }
    v1::LocalCallReply reply;
    if (!reply.ParseFromString(payload)) {
      return absl::DataLossError("a reply that is not a LocalCallReply");
    }
    return reply;
  }

 private:
  void Close() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }

  int fd_ = -1;
  bool said_hello_ = false;
  CallFrameParser frames_{uint64_t{64} << 20};
};

std::string FrameOf(uint64_t call_id, const v1::LocalCollectiveRequest& call,
                    absl::Duration timeout = kTimeout) {
  v1::LocalCallFrame frame;
  frame.set_call_id(call_id);
  frame.set_timeout_us(absl::ToInt64Microseconds(timeout));
  *frame.mutable_call() = call;
  return frame.SerializeAsString();
}

class LocalCallSocketTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // A short folder: a socket's path must stay under 108 bytes.
    char folder[] = "/tmp/chorus-calls-XXXXXX";
    ASSERT_NE(mkdtemp(folder), nullptr);
    folder_ = folder;
    absl::StatusOr<Daemon> coordinator = StartCoordinator();
    ASSERT_TRUE(coordinator.ok()) << coordinator.status();
    coordinator_ = *std::move(coordinator);
    absl::StatusOr<Daemon> worker =
        StartWorker(coordinator_.address,
                    {"--name=calls-w",
                     absl::StrCat("--local_socket=", folder_, "/w.sock")});
    ASSERT_TRUE(worker.ok()) << worker.status();
    worker_ = *std::move(worker);
    stub_ =
        v1::WorkerLocal::NewStub(MakeChannel(worker_.address, Role::kWorker));
  }

  void TearDown() override {
    worker_ = Daemon();  // killed, if it still runs: its sockets stay
    if (folder_.empty()) return;
    for (const char* name : {"/w.sock", "/w.sock.calls"}) {
      unlink(absl::StrCat(folder_, name).c_str());
    }
    rmdir(folder_.c_str());
  }

  // Joins ranks 0 .. world-1 of `group`; returns the responses.
  std::vector<v1::LocalJoinResponse> Join(const std::string& group, int world) {
    std::vector<v1::LocalJoinResponse> responses(world);
    std::vector<grpc::Status> joined(world);
    std::vector<std::thread> threads;
    for (int r = 0; r < world; ++r) {
      threads.emplace_back([&, r] {
        grpc::ClientContext context;
        context.set_deadline(DeadlineAfter(kTimeout));
        v1::LocalJoinRequest request;
        request.set_group(group);
        request.set_world_size(world);
        request.set_rank(r);
        joined[r] = stub_->JoinGroup(&context, request, &responses[r]);
      });
    }
    for (std::thread& t : threads) t.join();
    for (const grpc::Status& status : joined) {
      EXPECT_TRUE(status.ok()) << status.error_message();
    }
    return responses;
  }

  std::string folder_;
  Daemon coordinator_;
  Daemon worker_;
  std::unique_ptr<v1::WorkerLocal::Stub> stub_;
};

TEST_F(LocalCallSocketTest, Call_PipelinedFromTwoRanks_EachRepliedUnderItsId) {
  std::vector<v1::LocalJoinResponse> joined = Join("calls", 2);
  ASSERT_EQ(joined[0].call_socket(), absl::StrCat(folder_, "/w.sock.calls"));
  std::vector<absl::Status> ended(2);
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < 2; ++rank) {
    ranks.emplace_back([&, rank] {
      CallConnection connection(joined[rank].call_socket());
      if (!connection.ok()) {
        ended[rank] = absl::UnavailableError("cannot connect");
        return;
      }
      // Ids that are not the numbers: replies are matched by id.
      for (int i = 1; i <= kPipelined; ++i) {
        absl::Status sent = connection.Send(FrameOf(
            1000 + i, OneU32AllReduce("calls", joined[rank].epoch(), rank, i)));
        if (!sent.ok()) {
          ended[rank] = sent;
          return;
        }
      }
      absl::flat_hash_set<uint64_t> seen;
      const uint32_t two = 2;
      const std::string sum(reinterpret_cast<const char*>(&two), 4);
      for (int i = 0; i < kPipelined; ++i) {
        absl::StatusOr<v1::LocalCallReply> reply = connection.Read();
        if (!reply.ok()) {
          ended[rank] = reply.status();
          return;
        }
        const uint64_t number = reply->call_id() - 1000;
        if (reply->code() != 0 || number < 1 || number > kPipelined ||
            !seen.insert(number).second ||
            reply->response().sequence() != number ||
            reply->response().data() != sum) {
          ended[rank] = absl::InternalError(
              absl::StrCat("rank ", rank, ": ", reply->ShortDebugString()));
          return;
        }
      }
    });
  }
  for (std::thread& t : ranks) t.join();
  EXPECT_TRUE(ended[0].ok()) << ended[0];
  EXPECT_TRUE(ended[1].ok()) << ended[1];
}

TEST_F(LocalCallSocketTest,
       Call_SkippedNumber_RefusedUnderItsIdConnectionKept) {
  std::vector<v1::LocalJoinResponse> joined = Join("refused", 1);
  CallConnection connection(joined[0].call_socket());
  ASSERT_TRUE(connection.ok());
  // Number 2 before 1: a skip, found at the deadline.
  ASSERT_TRUE(connection
                  .Send(FrameOf(9,
                                OneU32AllReduce("refused", joined[0].epoch(), 0,
                                                /*sequence=*/2),
                                absl::Milliseconds(300)))
                  .ok());
  absl::StatusOr<v1::LocalCallReply> reply = connection.Read();
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->call_id(), 9u);
  EXPECT_EQ(reply->code(),
            static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_NE(reply->message().find("#1"), std::string::npos) << reply->message();
  // The same connection still serves: #1 now runs.
  ASSERT_TRUE(connection
                  .Send(FrameOf(
                      10, OneU32AllReduce("refused", joined[0].epoch(), 0, 1)))
                  .ok());
  reply = connection.Read();
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->call_id(), 10u);
  EXPECT_EQ(reply->code(), 0) << reply->message();
  EXPECT_EQ(reply->response().sequence(), 1u);
}

TEST_F(LocalCallSocketTest, Frame_NotALocalCallFrame_ReplyIdZeroThenClosed) {
  Join("garbage", 1);
  CallConnection connection(absl::StrCat(folder_, "/w.sock.calls"));
  ASSERT_TRUE(connection.ok());
  ASSERT_TRUE(connection.Send("\xff\xff\xff").ok());
  absl::StatusOr<v1::LocalCallReply> reply = connection.Read();
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->call_id(), 0u);
  EXPECT_EQ(reply->code(),
            static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(connection.Read().status().code(), absl::StatusCode::kUnavailable);
}

TEST_F(LocalCallSocketTest, Connection_DaemonStops_Closed) {
  std::vector<v1::LocalJoinResponse> joined = Join("stop", 2);
  CallConnection connection(joined[0].call_socket());
  ASSERT_TRUE(connection.ok());
  // Rank 0's call waits for rank 1, which never calls; the daemon stops.
  ASSERT_TRUE(
      connection
          .Send(FrameOf(1, OneU32AllReduce("stop", joined[0].epoch(), 0, 1)))
          .ok());
  ASSERT_TRUE(worker_.process->Signal(SIGTERM).ok());
  // The call may still get its answer (UNAVAILABLE: the worker is shutting
  // down) before the connection closes; nothing else comes.
  absl::StatusOr<v1::LocalCallReply> reply = connection.Read();
  if (reply.ok()) {
    EXPECT_EQ(reply->call_id(), 1u);
    EXPECT_EQ(reply->code(), static_cast<int>(absl::StatusCode::kUnavailable))
        << reply->ShortDebugString();
    reply = connection.Read();
  }
  EXPECT_EQ(reply.status().code(), absl::StatusCode::kUnavailable)
      << (reply.ok() ? reply->ShortDebugString() : "");
  absl::StatusOr<int> exited = worker_.process->WaitForExit(kTimeout);
  ASSERT_TRUE(exited.ok()) << exited.status();
  EXPECT_EQ(*exited, 0);
  EXPECT_NE(access(absl::StrCat(folder_, "/w.sock.calls").c_str(), F_OK), 0)
      << "the stopped daemon left its call socket";
}

}  // namespace
}  // namespace chorus::test
