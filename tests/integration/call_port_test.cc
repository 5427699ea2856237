// The coordinator's call port, spoken to over raw sockets by the test: the
// port workers learn at registration, a wrong hello (closed at once), a
// frame over the limit, a frame that is not a request (each: one reply with
// call id 0, then the connection closes), requests the core refuses, calls and
// commits alike (answered under their call id, the connection stays), a request
// trickling in byte by byte, the worker's client (a verdict as a status,
// shutdown, a port nothing listens on, blocking calls after an asynchronous
// one reading their own replies; asynchronous calls ending by verdict,
// at their own deadlines and at shutdown, and commits sent without
// waiting), and a coordinator with the port turned off (workers then call
// on the gRPC stream and collectives still run). A real chorus-coordinator
// process.

#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/call_frame.h"
#include "common/net.h"
#include "common/tcp_socket.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/worker/call_port_client.h"
#include "tests/testing/collective_harness.h"
#include "tests/testing/daemons.h"
#include "tests/testing/wait.h"

namespace chorus::test {
namespace {

using ::testing::HasSubstr;

constexpr absl::Duration kWait = absl::Seconds(30);

// Registers a worker and returns the call port the coordinator reported.
int CallPortOf(const std::string& coordinator) {
  auto stub = NewCoordinatorStub(coordinator);
  v1::RegisterWorkerRequest request;
  request.set_name("call-port-probe");
  request.set_host("probe-host");
  request.set_address("127.0.0.1:1");
  request.set_incarnation(1);
  request.add_devices()->set_kind(v1::DEVICE_KIND_CPU);
  absl::StatusOr<v1::RegisterWorkerResponse> response =
      RegisterWorker(*stub, request);
  EXPECT_TRUE(response.ok()) << response.status();
  return response.ok() ? static_cast<int>(response->call_port()) : -1;
}

// A raw connection to the call port.
class RawConnection {
 public:
  explicit RawConnection(int port) {
    absl::StatusOr<int> fd = ConnectTcp("127.0.0.1", port, absl::Now() + kWait);
    EXPECT_TRUE(fd.ok()) << fd.status();
    fd_ = fd.ok() ? *fd : -1;
  }
  ~RawConnection() {
    if (fd_ >= 0) CloseSocket(fd_);
  }

  void Send(absl::string_view bytes) {
    ASSERT_TRUE(WriteAll(fd_, &bytes, 1, absl::Now() + kWait, -1).ok());
  }
  void SendRequest(const v1::CallPortRequest& request) {
    std::string frame;
    AppendCallFrame(request.SerializeAsString(), &frame);
    Send(frame);
  }

  // The next reply, or an error when the connection closed first.
  absl::StatusOr<v1::CallPortReply> NextReply() {
    std::string payload;
    while (true) {
      absl::StatusOr<bool> next = frames_.Next(&payload);
      if (!next.ok()) return next.status();
      if (*next) break;
      char buffer[4096];
      absl::StatusOr<size_t> got =
          ReadSome(fd_, buffer, sizeof(buffer), absl::Now() + kWait, -1);
      if (!got.ok()) return got.status();
      frames_.Append(absl::string_view(buffer, *got));
    }
    v1::CallPortReply reply;
    if (!reply.ParseFromString(payload)) {
      return absl::InternalError("malformed reply");
    }
    return reply;
  }

  // True when the connection is still open after `wait` with nothing to
  // read.
  bool StillOpenAfter(absl::Duration wait) {
    char byte;
    return absl::IsDeadlineExceeded(
        ReadSome(fd_, &byte, 1, absl::Now() + wait, -1).status());
  }

  // True once the coordinator closed the connection (within kWait).
  bool Closed() {
    char buffer[64];
    while (true) {
      absl::StatusOr<size_t> got =
          ReadSome(fd_, buffer, sizeof(buffer), absl::Now() + kWait, -1);
      if (!got.ok()) return absl::IsUnavailable(got.status());
    }
  }

 private:
  int fd_ = -1;
  CallFrameParser frames_{1 << 20};
};

class CallPortTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<Daemon> coordinator = StartCoordinator();
    ASSERT_TRUE(coordinator.ok()) << coordinator.status();
    coordinator_ = *std::move(coordinator);
    port_ = CallPortOf(coordinator_.address);
    ASSERT_GT(port_, 0);
  }

  Daemon coordinator_;
  int port_ = 0;
};

TEST_F(CallPortTest, Connect_WrongHello_Closed) {
  RawConnection connection(port_);
  connection.Send("GET / HTTP/1.1\r\n\r\n");
  EXPECT_TRUE(connection.Closed());
}

TEST_F(CallPortTest, Connect_NoOrPartialHello_ClosedAfterGreetingTimeout) {
  // The port closes connections that have not greeted within 5 s; the
  // connection below that does greet stays.
  RawConnection silent(port_);
  RawConnection partial(port_);
  partial.Send(kCallHello.substr(0, 5));
  RawConnection greeted(port_);
  greeted.Send(kCallHello);
  const absl::Time start = absl::Now();
  EXPECT_TRUE(silent.Closed());
  EXPECT_TRUE(partial.Closed());
  EXPECT_GE(absl::Now() - start, absl::Seconds(4));
  v1::CallPortRequest empty;
  empty.set_call_id(3);
  greeted.SendRequest(empty);
  absl::StatusOr<v1::CallPortReply> reply = greeted.NextReply();
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->call_id(), 3u);
  EXPECT_EQ(reply->code(),
            static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_TRUE(WaitUntil(
      [&] {
        return absl::StrContains(coordinator_.process->ReadLog(),
                                 "sent no hello within 5s");
      },
      kWait));
}

TEST_F(CallPortTest, Connect_MoreSilentThanTheCap_OldestClosedFirst) {
  // 256 connections may wait for their greeting at once; the 257th closes
  // the oldest at once (not after the 5 s greeting timeout), and a client
  // that greets is still served.
  const absl::Time start = absl::Now();
  std::vector<std::unique_ptr<RawConnection>> silent;
  for (int i = 0; i < 257; ++i) {
    silent.push_back(std::make_unique<RawConnection>(port_));
  }
  EXPECT_TRUE(silent[0]->Closed());
  // The second is still open: the first went for the cap, not at its
  // greeting deadline (checked while that deadline cannot have come).
  const bool second_open = silent[1]->StillOpenAfter(absl::Milliseconds(200));
  if (absl::Now() - start < absl::Seconds(4)) EXPECT_TRUE(second_open);
  RawConnection greeted(port_);
  greeted.Send(kCallHello);
  v1::CallPortRequest empty;
  empty.set_call_id(4);
  greeted.SendRequest(empty);
  absl::StatusOr<v1::CallPortReply> reply = greeted.NextReply();
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->call_id(), 4u);
  EXPECT_THAT(coordinator_.process->ReadLog(),
              HasSubstr("256 connections have not greeted yet"));
}

TEST_F(CallPortTest, Frame_OverLimit_ResourceExhaustedThenClosed) {
  RawConnection connection(port_);
  connection.Send(kCallHello);
  connection.Send(std::string("\xff\xff\xff\x7f", 4));  // ~2 GiB announced
  absl::StatusOr<v1::CallPortReply> reply = connection.NextReply();
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->call_id(), 0u);
  EXPECT_EQ(reply->code(),
            static_cast<int>(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(reply->message(), HasSubstr("over the limit"));
  EXPECT_TRUE(connection.Closed());
}

TEST_F(CallPortTest, Frame_NotARequest_InvalidArgumentThenClosed) {
  RawConnection connection(port_);
  connection.Send(kCallHello);
  std::string frame;
  AppendCallFrame(std::string("\x0f", 1), &frame);  // wire type 7: invalid
  connection.Send(frame);
  absl::StatusOr<v1::CallPortReply> reply = connection.NextReply();
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->call_id(), 0u);
  EXPECT_EQ(reply->code(),
            static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_TRUE(connection.Closed());
}

TEST_F(CallPortTest, Request_RefusedByCore_AnsweredAndConnectionKept) {
  RawConnection connection(port_);
  connection.Send(kCallHello);
  v1::CallPortRequest no_call;
  no_call.set_call_id(7);
  connection.SendRequest(no_call);
  absl::StatusOr<v1::CallPortReply> reply = connection.NextReply();
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->call_id(), 7u);
  EXPECT_EQ(reply->code(),
            static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(reply->message(), HasSubstr("carries no CollectiveRequest"));

  v1::CallPortRequest negative;
  negative.set_call_id(8);
  negative.set_timeout_us(-5);
  negative.mutable_call()->set_group("g");
  connection.SendRequest(negative);
  reply = connection.NextReply();
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->call_id(), 8u);
  EXPECT_THAT(reply->message(), HasSubstr("negative timeout"));

  v1::CallPortRequest failure;
  failure.set_call_id(10);
  failure.mutable_failure()->set_group("no-such-group");
  failure.mutable_failure()->set_epoch(1);
  failure.mutable_failure()->set_code(14);
  connection.SendRequest(failure);
  reply = connection.NextReply();
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->call_id(), 10u);
  EXPECT_EQ(reply->code(), static_cast<int>(absl::StatusCode::kNotFound));
  EXPECT_FALSE(reply->has_abort());

  v1::CallPortRequest commit;
  commit.set_call_id(11);
  commit.set_timeout_us(10'000'000);
  commit.mutable_commit()->set_group("no-such-group");
  commit.mutable_commit()->set_epoch(1);
  commit.mutable_commit()->set_sequence(1);
  connection.SendRequest(commit);
  reply = connection.NextReply();
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->call_id(), 11u);
  EXPECT_NE(reply->code(), 0);
  EXPECT_THAT(reply->message(), HasSubstr("no-such-group"));

  // Sent one byte at a time: still one request.
  v1::CallPortRequest unknown;
  unknown.set_call_id(9);
  unknown.set_timeout_us(10'000'000);
  unknown.mutable_call()->set_group("no-such-group");
  unknown.mutable_call()->set_epoch(1);
  unknown.mutable_call()->set_sequence(1);
  unknown.mutable_call()->mutable_spec()->set_kind(v1::COLLECTIVE_KIND_BARRIER);
  std::string frame;
  AppendCallFrame(unknown.SerializeAsString(), &frame);
  for (char byte : frame) connection.Send(absl::string_view(&byte, 1));
  reply = connection.NextReply();
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->call_id(), 9u);
  EXPECT_EQ(reply->code(), static_cast<int>(absl::StatusCode::kNotFound));
  EXPECT_THAT(reply->message(), HasSubstr("no-such-group"));
}

// Barrier #1 of a group the coordinator does not know: answered at once
// with NOT_FOUND.
v1::CollectiveRequest BarrierOfNoGroup() {
  v1::CollectiveRequest request;
  request.set_group("no-such-group");
  request.set_epoch(1);
  request.set_sequence(1);
  request.mutable_spec()->set_kind(v1::COLLECTIVE_KIND_BARRIER);
  return request;
}

TEST_F(CallPortTest, Client_Verdict_ReturnedAsStatus) {
  CallPortClient client([this] { return absl::StrCat("127.0.0.1:", port_); });
  ASSERT_TRUE(client.Ready(absl::Now() + kWait).ok());
  v1::CollectiveRequest request = BarrierOfNoGroup();
  absl::StatusOr<v1::CollectiveResponse> r =
      client.Call(request, absl::Now() + kWait);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("no-such-group"));
  client.Shutdown();
  EXPECT_EQ(client.Call(request, absl::Now() + kWait).status().code(),
            absl::StatusCode::kUnavailable);
}

// What an asynchronous call ended with, once it did.
struct AsyncResult {
  absl::Notification done;
  absl::Status status;

  CallPortClient::CallDone Callback() {
    return [this](absl::StatusOr<v1::CollectiveResponse> result) {
      status = result.status();
      done.Notify();
    };
  }
};

TEST_F(CallPortTest, CallAsync_Verdict_CallbackGetsStatus) {
  CallPortClient client([this] { return absl::StrCat("127.0.0.1:", port_); });
  v1::CollectiveRequest request = BarrierOfNoGroup();
  AsyncResult first;
  client.CallAsync(request, absl::Now() + kWait, first.Callback());
  ASSERT_TRUE(first.done.WaitForNotificationWithTimeout(kWait));
  EXPECT_EQ(first.status.code(), absl::StatusCode::kNotFound) << first.status;
  EXPECT_THAT(std::string(first.status.message()), HasSubstr("no-such-group"));
  client.Shutdown();
  AsyncResult late;
  client.CallAsync(request, absl::Now() + kWait, late.Callback());
  ASSERT_TRUE(late.done.HasBeenNotified());
  EXPECT_EQ(late.status.code(), absl::StatusCode::kUnavailable) << late.status;
}

TEST_F(CallPortTest, CommitAsync_Verdict_CallbackGetsStatus) {
  CallPortClient client([this] { return absl::StrCat("127.0.0.1:", port_); });
  v1::CommitRequest request;
  request.set_group("no-such-group");
  request.set_epoch(1);
  request.set_sequence(4);
  AsyncResult first;
  client.CommitAsync(request, absl::Now() + kWait,
                     [&first](absl::Status verdict) {
                       first.status = verdict;
                       first.done.Notify();
                     });
  ASSERT_TRUE(first.done.WaitForNotificationWithTimeout(kWait));
  EXPECT_EQ(first.status.code(), absl::StatusCode::kNotFound) << first.status;
  EXPECT_THAT(std::string(first.status.message()), HasSubstr("no-such-group"));
  client.Shutdown();
  AsyncResult late;
  client.CommitAsync(request, absl::Now() + kWait,
                     [&late](absl::Status verdict) {
                       late.status = verdict;
                       late.done.Notify();
                     });
  ASSERT_TRUE(late.done.HasBeenNotified());
  EXPECT_EQ(late.status.code(), absl::StatusCode::kUnavailable) << late.status;
}

// A listener that never accepts: a client's connection and hello land in
// its backlog, and no reply ever comes. Closed when it goes.
struct SilentPort {
  SilentPort() {
    absl::StatusOr<Listener> listener = ListenTcp("127.0.0.1", 0);
    EXPECT_TRUE(listener.ok()) << listener.status();
    if (listener.ok()) {
      fd = listener->fd;
      port = listener->port;
    }
  }
  ~SilentPort() { CloseSocket(fd); }
  std::function<std::string()> Address() const {
    return [port = port] { return absl::StrCat("127.0.0.1:", port); };
  }
  int fd = -1;
  int port = 0;
};

TEST(CallPortClientTest, CallAsync_SilentPort_EachCallEndsAtItsDeadline) {
  SilentPort silent;
  CallPortClient client(silent.Address());
  v1::CollectiveRequest request;
  request.set_group("g");
  request.set_sequence(1);
  AsyncResult long_call;
  client.CallAsync(request, absl::Now() + absl::Minutes(10),
                   long_call.Callback());
  // Due long before the first: it ends at its own deadline, not the first's.
  request.set_sequence(2);
  AsyncResult short_call;
  client.CallAsync(request, absl::Now() + absl::Milliseconds(300),
                   short_call.Callback());
  ASSERT_TRUE(short_call.done.WaitForNotificationWithTimeout(kWait));
  EXPECT_EQ(short_call.status.code(), absl::StatusCode::kDeadlineExceeded)
      << short_call.status;
  EXPECT_THAT(std::string(short_call.status.message()),
              HasSubstr("collective #2 of group g"));
  EXPECT_FALSE(long_call.done.HasBeenNotified()) << long_call.status;
  // Shutting down ends the other, and waits until its callback ran.
  client.Shutdown();
  ASSERT_TRUE(long_call.done.HasBeenNotified());
  EXPECT_EQ(long_call.status.code(), absl::StatusCode::kUnavailable)
      << long_call.status;
}

TEST(CallPortClientTest, CommitAsync_SilentPort_EndsAtItsDeadline) {
  SilentPort silent;
  CallPortClient client(silent.Address());
  v1::CommitRequest request;
  request.set_group("g");
  request.set_sequence(7);
  AsyncResult commit;
  const absl::Time start = absl::Now();
  client.CommitAsync(request, start + absl::Milliseconds(300),
                     [&commit](absl::Status verdict) {
                       commit.status = verdict;
                       commit.done.Notify();
                     });
  ASSERT_TRUE(commit.done.WaitForNotificationWithTimeout(kWait));
  EXPECT_EQ(commit.status.code(), absl::StatusCode::kDeadlineExceeded)
      << commit.status;
  EXPECT_THAT(std::string(commit.status.message()),
              HasSubstr("the commit of collective #7 of group g"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  client.Shutdown();
}

TEST(CallPortClientTest, CallAsync_AfterAnIdleSpell_EndsAtItsOwnDeadline) {
  SilentPort silent;
  CallPortClient client(silent.Address());
  v1::CollectiveRequest request;
  request.set_group("g");
  // Once the first call ended, the completion thread reads on with no call
  // waiting (up to 10 s ahead); a later call due sooner, and a blocking
  // one, still end at their own deadlines, well before that.
  for (uint64_t sequence : {1, 2}) {
    request.set_sequence(sequence);
    AsyncResult call;
    const absl::Time start = absl::Now();
    client.CallAsync(request, start + absl::Milliseconds(300), call.Callback());
    ASSERT_TRUE(call.done.WaitForNotificationWithTimeout(kWait));
    EXPECT_EQ(call.status.code(), absl::StatusCode::kDeadlineExceeded)
        << call.status;
    EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  }
  request.set_sequence(3);
  const absl::Time start = absl::Now();
  EXPECT_EQ(
      client.Call(request, start + absl::Milliseconds(300)).status().code(),
      absl::StatusCode::kDeadlineExceeded);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  client.Shutdown();
}

// How many times this process's thread named `name` went to sleep and was
// woken (voluntary context switches, from /proc); -1 when there is none.
int64_t SleepsOfThread(absl::string_view name) {
  std::error_code error;
  for (const auto& task :
       std::filesystem::directory_iterator("/proc/self/task", error)) {
    std::ifstream comm(task.path() / "comm");
    std::string line;
    if (!std::getline(comm, line) || line != name) continue;
    std::ifstream status(task.path() / "status");
    while (std::getline(status, line)) {
      absl::string_view field = line;
      int64_t count = 0;
      if (absl::ConsumePrefix(&field, "voluntary_ctxt_switches:") &&
          absl::SimpleAtoi(absl::StripAsciiWhitespace(field), &count)) {
        return count;
      }
    }
  }
  return -1;
}

TEST_F(CallPortTest, Call_AfterAnAsyncCall_ReadsItsOwnReply) {
  CallPortClient client([this] { return absl::StrCat("127.0.0.1:", port_); });
  v1::CollectiveRequest request = BarrierOfNoGroup();
  AsyncResult first;
  client.CallAsync(request, absl::Now() + kWait, first.Callback());
  ASSERT_TRUE(first.done.WaitForNotificationWithTimeout(kWait));
  ASSERT_EQ(first.status.code(), absl::StatusCode::kNotFound) << first.status;
  // The completion thread now reads ahead; the first blocking call stops
  // that. From then on each caller reads its own reply: the completion
  // thread sleeps through the calls rather than wake for each reply.
  ASSERT_EQ(client.Call(request, absl::Now() + kWait).status().code(),
            absl::StatusCode::kNotFound);
  const int64_t before = SleepsOfThread("chorus-callport");
  ASSERT_GE(before, 0) << "no completion thread";
  constexpr int kCalls = 200;
  for (int i = 0; i < kCalls; ++i) {
    ASSERT_EQ(client.Call(request, absl::Now() + kWait).status().code(),
              absl::StatusCode::kNotFound);
  }
  EXPECT_LT(SleepsOfThread("chorus-callport") - before, kCalls / 10);
  // An asynchronous call is still served by the completion thread.
  AsyncResult later;
  client.CallAsync(request, absl::Now() + kWait, later.Callback());
  ASSERT_TRUE(later.done.WaitForNotificationWithTimeout(kWait));
  EXPECT_EQ(later.status.code(), absl::StatusCode::kNotFound) << later.status;
  client.Shutdown();
}

TEST(CallPortClientTest, Ready_NothingListening_FailedPreconditionThenBackoff) {
  // A port that was just free: nothing listens there.
  absl::StatusOr<Listener> listener = ListenTcp("127.0.0.1", 0);
  ASSERT_TRUE(listener.ok()) << listener.status();
  const int port = listener->port;
  CloseSocket(listener->fd);
  CallPortClient client([port] { return absl::StrCat("127.0.0.1:", port); });
  absl::Status ready = client.Ready(absl::Now() + kWait);
  EXPECT_EQ(ready.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(ready.message()), HasSubstr("cannot reach"));
  // Not tried again for a while: the runtime takes the gRPC paths.
  ready = client.Ready(absl::Now() + kWait);
  EXPECT_EQ(ready.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(ready.message()), HasSubstr("moments ago"));
  v1::CollectiveRequest request;
  request.set_group("g");
  EXPECT_EQ(client.Call(request, absl::Now() + kWait).status().code(),
            absl::StatusCode::kUnavailable);
}

TEST(CallPortOffTest, Collectives_CoordinatorWithoutCallPort_RunOnUnaryCalls) {
  auto cluster = EmbeddedCluster::Start(2, {"--call_port=-1"});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  EXPECT_EQ(CallPortOf((*cluster)->coordinator_address()), 0);
  auto group = (*cluster)->JoinGroup("no-call-port", 2);
  ASSERT_TRUE(group.ok()) << group.status();
  for (uint64_t count : {uint64_t{1}, uint64_t{100000}}) {
    CollectiveCase c;
    c.spec =
        Spec(CollectiveKind::kAllReduce, DType::kF32, count, ReduceOp::kSum);
    ASSERT_TRUE(RunAndCheck(Pointers(*group), c));
  }
}

}  // namespace
}  // namespace chorus::test
