// Failure tests: bad input against the real coordinator over gRPC. Every
// malformed call gets its documented code (INVALID_ARGUMENT, NOT_FOUND,
// FAILED_PRECONDITION, UNIMPLEMENTED or RESOURCE_EXHAUSTED) with a message
// that says what was wrong, and changes nothing the coordinator lists. The
// calls go through the raw chorus.v1.Coordinator stub, each with a deadline;
// the workers are registered by hand (they send no heartbeats, so the
// coordinator runs with a lease longer than the test).

#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/channel_arguments.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "chorus/v1/coordinator.grpc.pb.h"
#include "common/grpc_status.h"
#include "common/net.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/daemons.h"
#include "tests/testing/failure_cluster.h"
#include "tests/testing/wait.h"

namespace chorus::test {
namespace {

using ::testing::HasSubstr;

constexpr int kMaxWorldSize = 8;
// An enum value no version of the protocol defines.
constexpr int kUnknownEnum = 42;
// A sequence number far beyond any window of outstanding calls.
constexpr uint64_t kFarFutureSequence = 1000000000;
// The servers' receive limit (net.h's kDefaultMaxMessageBytes) and a
// message over it.
constexpr size_t kOverLimitBytes = size_t{65} << 20;

v1::Device DeviceOf(v1::DeviceKind kind, int index = 0) {
  v1::Device device;
  device.set_kind(kind);
  device.set_index(index);
  return device;
}

v1::RegisterWorkerRequest FakeWorker(const std::string& name) {
  v1::RegisterWorkerRequest request;
  request.set_name(name);
  request.set_host("test-host");
  // Nobody serves here: these tests never reach the data plane.
  request.set_address("127.0.0.1:1");
  request.set_incarnation(7);
  *request.add_devices() = DeviceOf(v1::DEVICE_KIND_CPU);
  return request;
}

// Everything ListWorkers and ListGroups return, less the ages that change
// between two calls.
std::string StateSnapshot(v1::Coordinator::Stub& stub) {
  std::string out;
  {
    grpc::ClientContext context;
    context.set_deadline(DeadlineAfter(kRpcTimeout));
    v1::ListWorkersResponse response;
    const grpc::Status status =
        stub.ListWorkers(&context, v1::ListWorkersRequest(), &response);
    if (!status.ok()) return "ListWorkers failed: " + status.error_message();
    std::sort(response.mutable_workers()->begin(),
              response.mutable_workers()->end(),
              [](const v1::WorkerInfo& a, const v1::WorkerInfo& b) {
                return a.worker_id() < b.worker_id();
              });
    for (v1::WorkerInfo& worker : *response.mutable_workers()) {
      worker.clear_lease_age_ms();
    }
    out += response.DebugString();
  }
  {
    grpc::ClientContext context;
    context.set_deadline(DeadlineAfter(kRpcTimeout));
    v1::ListGroupsResponse response;
    const grpc::Status status =
        stub.ListGroups(&context, v1::ListGroupsRequest(), &response);
    if (!status.ok()) return "ListGroups failed: " + status.error_message();
    for (v1::GroupInfo& group : *response.mutable_groups()) {
      group.clear_pending_ms();
    }
    for (v1::GroupInfo& group : *response.mutable_forming()) {
      group.clear_pending_ms();
    }
    out += response.DebugString();
  }
  return out;
}

absl::StatusOr<v1::JoinGroupResponse> JoinGroup(
    v1::Coordinator::Stub& stub, const v1::JoinGroupRequest& request,
    absl::Duration timeout = kRpcTimeout) {
  grpc::ClientContext context;
  context.set_deadline(DeadlineAfter(timeout));
  v1::JoinGroupResponse response;
  absl::Status status =
      FromGrpcStatus(stub.JoinGroup(&context, request, &response));
  if (!status.ok()) return status;
  return response;
}

v1::JoinGroupRequest JoinRequest(const std::string& group, int world_size,
                                 int rank, uint64_t worker_id,
                                 const std::string& request_id = "") {
  v1::JoinGroupRequest request;
  request.set_group(group);
  request.set_world_size(world_size);
  request.set_rank(rank);
  request.set_worker_id(worker_id);
  *request.mutable_device() = DeviceOf(v1::DEVICE_KIND_CPU);
  request.set_request_id(request_id);
  return request;
}

// A JoinGroup call that waits on a thread of its own.
class AsyncJoin {
 public:
  AsyncJoin(v1::Coordinator::Stub* stub, v1::JoinGroupRequest request,
            absl::Duration timeout)
      : thread_([this, stub, request = std::move(request), timeout] {
          result_ = JoinGroup(*stub, request, timeout);
          done_.Notify();
        }) {}
  ~AsyncJoin() { thread_.join(); }

  bool WaitFor(absl::Duration timeout) {
    return done_.WaitForNotificationWithTimeout(timeout);
  }
  bool done() const { return done_.HasBeenNotified(); }
  // Valid once done().
  const absl::StatusOr<v1::JoinGroupResponse>& result() const {
    return result_;
  }

 private:
  absl::StatusOr<v1::JoinGroupResponse> result_ = absl::UnknownError("not run");
  absl::Notification done_;
  std::thread thread_;
};

// Returns the first of `joins` to end, waiting up to `timeout`.
AsyncJoin* FirstToEnd(const std::vector<AsyncJoin*>& joins,
                      absl::Duration timeout) {
  AsyncJoin* first = nullptr;
  WaitUntil(
      [&] {
        for (AsyncJoin* join : joins) {
          if (join->done()) first = join;
        }
        return first != nullptr;
      },
      timeout, absl::Milliseconds(5));
  return first;
}

class BadInputTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<Daemon> coordinator =
        StartCoordinator({"--lease_timeout=10m",
                          absl::StrCat("--max_world_size=", kMaxWorldSize)});
    ASSERT_TRUE(coordinator.ok()) << coordinator.status();
    coordinator_ = *std::move(coordinator);
    stub_ = NewCoordinatorStub(coordinator_.address);
    for (const char* name : {"worker-a", "worker-b", "worker-c", "worker-d"}) {
      absl::StatusOr<v1::RegisterWorkerResponse> registered =
          RegisterWorker(*stub_, FakeWorker(name));
      ASSERT_TRUE(registered.ok()) << registered.status();
      worker_ids_.push_back(registered->worker_id());
    }
  }

  // Forms `group` with rank r on worker r; returns the epoch, or 0.
  uint64_t Form(const std::string& group, int world_size) {
    std::vector<std::unique_ptr<AsyncJoin>> joins;
    for (int rank = 0; rank < world_size; ++rank) {
      joins.push_back(std::make_unique<AsyncJoin>(
          stub_.get(), JoinRequest(group, world_size, rank, worker_ids_[rank]),
          kRpcTimeout));
    }
    uint64_t epoch = 0;
    for (auto& join : joins) {
      join->WaitFor(absl::InfiniteDuration());
      EXPECT_TRUE(join->result().ok()) << join->result().status();
      if (join->result().ok()) epoch = join->result()->epoch();
    }
    return epoch;
  }

  Daemon coordinator_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;
  std::vector<uint64_t> worker_ids_;
};

struct BadCollective {
  std::string name;
  std::function<void(v1::CollectiveRequest&)> mutate;
  absl::StatusCode code;
  std::string message;
};

TEST_F(BadInputTest, Collective_BadRequests_RefusedWithoutStateChange) {
  const uint64_t stale_epoch = Form("table", 2);
  const uint64_t epoch = Form("table", 2);
  ASSERT_NE(stale_epoch, 0u);
  ASSERT_GT(epoch, stale_epoch);

  // A valid first call of rank 0 (never sent as is: it would wait).
  v1::CollectiveRequest base;
  base.set_group("table");
  base.set_epoch(epoch);
  base.set_rank(0);
  base.set_sequence(1);
  base.mutable_spec()->set_kind(v1::COLLECTIVE_KIND_ALL_REDUCE);
  base.mutable_spec()->set_dtype(v1::DTYPE_F32);
  base.mutable_spec()->set_count(4);
  base.mutable_spec()->set_op(v1::REDUCE_OP_SUM);
  base.set_has_inline_data(true);
  base.set_inline_data(std::string(16, '\1'));

  using Request = v1::CollectiveRequest;
  const absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;
  const std::vector<BadCollective> cases = {
      {"unknown kind",
       [](Request& r) {
         r.mutable_spec()->set_kind(
             static_cast<v1::CollectiveKind>(kUnknownEnum));
       },
       kInvalid, "unknown collective kind 42"},
      {"unknown dtype",
       [](Request& r) {
         r.mutable_spec()->set_dtype(static_cast<v1::DType>(kUnknownEnum));
       },
       kInvalid, "invalid dtype 42"},
      {"unknown reduce op",
       [](Request& r) {
         r.mutable_spec()->set_op(static_cast<v1::ReduceOp>(kUnknownEnum));
       },
       kInvalid, "invalid reduce op 42"},
      {"unspecified reduce op",
       [](Request& r) { r.mutable_spec()->set_op(v1::REDUCE_OP_UNSPECIFIED); },
       kInvalid, "invalid reduce op 0"},
      {"unknown algorithm",
       [](Request& r) {
         r.set_algorithm(static_cast<v1::Algorithm>(kUnknownEnum));
       },
       kInvalid, "unknown algorithm 42"},
      {"unknown device kind",
       [](Request& r) {
         *r.mutable_device() =
             DeviceOf(static_cast<v1::DeviceKind>(kUnknownEnum));
       },
       kInvalid, "unknown device kind 42"},
      {"data shorter than count x dtype",
       [](Request& r) { r.set_inline_data(std::string(15, '\1')); }, kInvalid,
       "passed 15 bytes for all_reduce f32[4] sum in a group of 2; "
       "expected 16"},
      {"data longer than count x dtype",
       [](Request& r) { r.mutable_spec()->set_dtype(v1::DTYPE_F16); }, kInvalid,
       "passed 16 bytes for all_reduce f16[4] sum in a group of 2; "
       "expected 8"},
      {"data without has_inline_data",
       [](Request& r) { r.set_has_inline_data(false); }, kInvalid,
       "data given without has_data"},
      {"count over the maximum",
       [](Request& r) {
         r.mutable_spec()->set_count((uint64_t{1} << 40) + 1);
         r.clear_inline_data();
         r.set_has_inline_data(false);
       },
       kInvalid, "count 1099511627777 is over the maximum"},
      {"count whose byte size overflows",
       [](Request& r) {
         r.mutable_spec()->set_count(UINT64_MAX);
         r.mutable_spec()->set_dtype(v1::DTYPE_F64);
       },
       kInvalid, "is over the maximum"},
      {"negative rank", [](Request& r) { r.set_rank(-1); }, kInvalid,
       "rank -1 is out of range for group table"},
      {"rank equal to the world size", [](Request& r) { r.set_rank(2); },
       kInvalid, "rank 2 is out of range for group table"},
      {"unknown group", [](Request& r) { r.set_group("no-such-group"); },
       absl::StatusCode::kNotFound, "unknown group \"no-such-group\""},
      {"stale epoch", [&](Request& r) { r.set_epoch(stale_epoch); },
       absl::StatusCode::kFailedPrecondition,
       absl::StrCat("stale epoch ", stale_epoch, " for group table")},
      {"epoch from the future", [&](Request& r) { r.set_epoch(epoch + 1); },
       absl::StatusCode::kFailedPrecondition, "stale epoch"},
      // Calls issued together may arrive out of order, so a rank may run a
      // window ahead of its oldest uncalled collective; this is far beyond.
      {"sequence from the future",
       [](Request& r) { r.set_sequence(kFarFutureSequence); }, kInvalid,
       "sent sequence 1000000000 from the future"},
      {"sequence 0", [](Request& r) { r.set_sequence(0); }, kInvalid,
       "sequences start at 1"},
      {"root equal to the world size",
       [](Request& r) {
         r.mutable_spec()->set_kind(v1::COLLECTIVE_KIND_BROADCAST);
         r.mutable_spec()->set_root(2);
       },
       kInvalid, "root 2 is out of range for world size 2"},
      {"negative root",
       [](Request& r) {
         r.mutable_spec()->set_kind(v1::COLLECTIVE_KIND_GATHER);
         r.mutable_spec()->set_root(-1);
       },
       kInvalid, "root -1 is out of range for world size 2"},
      {"barrier with a count",
       [](Request& r) {
         r.mutable_spec()->set_kind(v1::COLLECTIVE_KIND_BARRIER);
         r.mutable_spec()->set_count(3);
       },
       kInvalid, "barrier carries no data, got count 3"},
      {"device kind OTHER without a name",
       [](Request& r) {
         *r.mutable_device() = DeviceOf(v1::DEVICE_KIND_OTHER);
       },
       kInvalid, "device kind OTHER needs other_kind"},
  };

  const std::string before = StateSnapshot(*stub_);
  for (const BadCollective& bad : cases) {
    SCOPED_TRACE(bad.name);
    v1::CollectiveRequest request = base;
    bad.mutate(request);
    grpc::ClientContext context;
    context.set_deadline(DeadlineAfter(kRpcTimeout));
    v1::CollectiveResponse response;
    const absl::Status status =
        FromGrpcStatus(stub_->Collective(&context, request, &response));
    EXPECT_THAT(status, StatusIs(bad.code, HasSubstr(bad.message)));
    EXPECT_EQ(StateSnapshot(*stub_), before);
  }

  // A message over the server's limit, sent on a channel without a send
  // limit of its own so that the server is the one to refuse it.
  grpc::ChannelArguments args;
  args.SetMaxSendMessageSize(-1);
  args.SetMaxReceiveMessageSize(-1);
  std::unique_ptr<v1::Coordinator::Stub> unlimited =
      v1::Coordinator::NewStub(grpc::CreateCustomChannel(
          coordinator_.address, grpc::InsecureChannelCredentials(), args));
  v1::CollectiveRequest huge = base;
  huge.mutable_spec()->set_count(kOverLimitBytes / 4);
  huge.set_inline_data(std::string(kOverLimitBytes, '\1'));
  grpc::ClientContext context;
  context.set_deadline(DeadlineAfter(absl::Seconds(60)));
  v1::CollectiveResponse response;
  EXPECT_THAT(FromGrpcStatus(unlimited->Collective(&context, huge, &response)),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("larger than max")));
  EXPECT_EQ(StateSnapshot(*stub_), before);
}

struct BadJoin {
  std::string name;
  std::function<void(v1::JoinGroupRequest&)> mutate;
  absl::StatusCode code;
  std::string message;
};

TEST_F(BadInputTest, JoinGroup_BadRequests_RefusedWithoutStateChange) {
  ASSERT_NE(Form("existing", 2), 0u);
  using Request = v1::JoinGroupRequest;
  const absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;
  const std::vector<BadJoin> cases = {
      {"world size 0", [](Request& r) { r.set_world_size(0); }, kInvalid,
       "world size 0 of group join-table is out of range [1, 8]"},
      {"negative world size", [](Request& r) { r.set_world_size(-2); },
       kInvalid, "world size -2 of group join-table is out of range"},
      {"world size over --max_world_size",
       [](Request& r) { r.set_world_size(kMaxWorldSize + 1); }, kInvalid,
       "world size 9 of group join-table is out of range [1, 8]"},
      {"negative rank", [](Request& r) { r.set_rank(-1); }, kInvalid,
       "rank -1 is out of range for group join-table of world size 2"},
      {"rank equal to the world size", [](Request& r) { r.set_rank(2); },
       kInvalid, "rank 2 is out of range for group join-table"},
      {"empty group name", [](Request& r) { r.set_group(""); }, kInvalid,
       "group name must not be empty"},
      {"unknown worker id", [](Request& r) { r.set_worker_id(999999); },
       absl::StatusCode::kUnavailable,
       "the coordinator does not know worker id 999999"},
      {"unknown device kind",
       [](Request& r) {
         *r.mutable_device() =
             DeviceOf(static_cast<v1::DeviceKind>(kUnknownEnum));
       },
       kInvalid, "unknown device kind 42"},
      {"negative device index",
       [](Request& r) {
         *r.mutable_device() = DeviceOf(v1::DEVICE_KIND_CUDA, -1);
       },
       kInvalid, "device index must not be negative"},
      // A join refused for its device is remembered for its formation (the
      // other ranks are told at once; see the test below), so these two go
      // to groups of their own.
      {"a GPU the worker did not register",
       [](Request& r) {
         r.set_group("refused-cuda");
         *r.mutable_device() = DeviceOf(v1::DEVICE_KIND_CUDA);
       },
       absl::StatusCode::kUnimplemented,
       "Distributed operations are not supported for device Cuda(0)"},
      {"a device kind without distributed support",
       [](Request& r) {
         r.set_group("refused-wgpu");
         *r.mutable_device() = DeviceOf(v1::DEVICE_KIND_WGPU);
       },
       absl::StatusCode::kUnimplemented,
       "Distributed operations are not supported for device Wgpu(0)"},
  };
  const std::string before = StateSnapshot(*stub_);
  for (const BadJoin& bad : cases) {
    SCOPED_TRACE(bad.name);
    Request request = JoinRequest("join-table", 2, 0, worker_ids_[0]);
    bad.mutate(request);
    EXPECT_THAT(JoinGroup(*stub_, request),
                StatusIs(bad.code, HasSubstr(bad.message)));
    EXPECT_EQ(StateSnapshot(*stub_), before);
  }
  // None of them left a pending join behind: the group forms with exactly
  // the members of a fresh rendezvous.
  EXPECT_NE(Form("join-table", 2), 0u);
}

// A join refused for its device: the other rank's join fails at once
// naming it; once the refused rank has joined on its CPU the group forms.
TEST_F(BadInputTest, JoinGroup_UnsupportedDevice_OthersRefusedUntilItRejoins) {
  v1::JoinGroupRequest wgpu = JoinRequest("refused", 2, 0, worker_ids_[0]);
  *wgpu.mutable_device() = DeviceOf(v1::DEVICE_KIND_WGPU);
  EXPECT_THAT(JoinGroup(*stub_, wgpu),
              StatusIs(absl::StatusCode::kUnimplemented,
                       HasSubstr("not supported for device Wgpu(0)")));
  const absl::Time start = absl::Now();
  EXPECT_THAT(
      JoinGroup(*stub_, JoinRequest("refused", 2, 1, worker_ids_[1])),
      StatusIs(absl::StatusCode::kFailedPrecondition,
               HasSubstr("rank 0 of group refused was refused: Distributed "
                         "operations are not supported for device Wgpu(0)")));
  EXPECT_LT(absl::Now() - start, kRpcTimeout / 2);
  // Rank 0 on its CPU clears the refusal even though it then gives up
  // waiting; afterwards the group forms whichever rank comes first.
  EXPECT_EQ(JoinGroup(*stub_, JoinRequest("refused", 2, 0, worker_ids_[0]),
                      absl::Seconds(1))
                .status()
                .code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(Form("refused", 2), 0u);
}

TEST_F(BadInputTest, JoinGroup_DuplicateRankOrOtherWorldSize_Refused) {
  // Two workers race for rank 0 of a group of 3: one waits, the other is
  // refused naming the winner.
  AsyncJoin a(stub_.get(), JoinRequest("forming", 3, 0, worker_ids_[0]),
              absl::Seconds(60));
  AsyncJoin b(stub_.get(), JoinRequest("forming", 3, 0, worker_ids_[1]),
              absl::Seconds(60));
  AsyncJoin* loser = FirstToEnd({&a, &b}, absl::Seconds(30));
  ASSERT_NE(loser, nullptr) << "neither duplicate join was refused";
  AsyncJoin& winner = loser == &a ? b : a;
  const std::string winner_name = loser == &a ? "worker-b" : "worker-a";
  const uint64_t winner_id = worker_ids_[loser == &a ? 1 : 0];
  EXPECT_THAT(loser->result(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr(absl::StrCat("rank 0 of group forming was "
                                              "already joined by worker \"",
                                              winner_name, "\""))));
  EXPECT_FALSE(winner.done());

  const std::string before = StateSnapshot(*stub_);
  // Now that rank 0 is known to wait: a third claim, and a join asking for
  // another world size.
  EXPECT_THAT(JoinGroup(*stub_, JoinRequest("forming", 3, 0, worker_ids_[2])),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("already joined")));
  EXPECT_THAT(JoinGroup(*stub_, JoinRequest("forming", 2, 1, worker_ids_[2])),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("group forming is forming with world size 3; "
                                 "rank 1 asked for 2")));
  EXPECT_EQ(StateSnapshot(*stub_), before);

  // The rendezvous is intact: ranks 1 and 2 complete it around the winner.
  AsyncJoin rank1(stub_.get(), JoinRequest("forming", 3, 1, worker_ids_[2]),
                  kRpcTimeout);
  AsyncJoin rank2(stub_.get(), JoinRequest("forming", 3, 2, worker_ids_[3]),
                  kRpcTimeout);
  for (AsyncJoin* join : {&winner, &rank1, &rank2}) {
    ASSERT_TRUE(join->WaitFor(kRpcTimeout));
    ASSERT_TRUE(join->result().ok()) << join->result().status();
    ASSERT_EQ(join->result()->members_size(), 3);
    EXPECT_EQ(join->result()->members(0).worker_id(), winner_id);
    EXPECT_EQ(join->result()->members(1).worker_id(), worker_ids_[2]);
    EXPECT_EQ(join->result()->members(2).worker_id(), worker_ids_[3]);
  }
}

TEST_F(BadInputTest, JoinGroup_RetriedWithSameRequestId_CountedOnce) {
  // The same join sent twice (a client retrying): the later one takes the
  // first one's place rather than claiming rank 0 a second time.
  AsyncJoin first(stub_.get(),
                  JoinRequest("retried", 2, 0, worker_ids_[0], "join-a"),
                  absl::Seconds(60));
  AsyncJoin second(stub_.get(),
                   JoinRequest("retried", 2, 0, worker_ids_[0], "join-a"),
                   absl::Seconds(60));
  AsyncJoin* superseded = FirstToEnd({&first, &second}, absl::Seconds(30));
  ASSERT_NE(superseded, nullptr);
  EXPECT_THAT(superseded->result(),
              StatusIs(absl::StatusCode::kAborted,
                       HasSubstr("superseded by a retry of the same join")));
  AsyncJoin& kept = superseded == &first ? second : first;
  EXPECT_FALSE(kept.done());

  absl::StatusOr<v1::JoinGroupResponse> rank1 =
      JoinGroup(*stub_, JoinRequest("retried", 2, 1, worker_ids_[1], "join-b"));
  ASSERT_TRUE(rank1.ok()) << rank1.status();
  ASSERT_TRUE(kept.WaitFor(kRpcTimeout));
  ASSERT_TRUE(kept.result().ok()) << kept.result().status();
  EXPECT_EQ(kept.result()->epoch(), rank1->epoch());
  ASSERT_EQ(rank1->members_size(), 2);
  EXPECT_EQ(rank1->members(0).worker_id(), worker_ids_[0]);
  EXPECT_EQ(rank1->members(1).worker_id(), worker_ids_[1]);

  // A retry arriving after the group formed gets the same group back: no new
  // rendezvous, no new epoch.
  const std::string before = StateSnapshot(*stub_);
  absl::StatusOr<v1::JoinGroupResponse> late =
      JoinGroup(*stub_, JoinRequest("retried", 2, 0, worker_ids_[0], "join-a"),
                absl::Seconds(5));
  ASSERT_TRUE(late.ok()) << late.status();
  EXPECT_EQ(late->epoch(), rank1->epoch());
  EXPECT_EQ(late->members_size(), 2);
  EXPECT_EQ(StateSnapshot(*stub_), before);
}

TEST_F(BadInputTest, OtherCalls_BadRequests_RefusedWithoutStateChange) {
  const uint64_t stale_epoch = Form("other", 2);
  const uint64_t epoch = Form("other", 2);
  const std::string before = StateSnapshot(*stub_);
  auto expect_unchanged = [&] { EXPECT_EQ(StateSnapshot(*stub_), before); };

  {
    SCOPED_TRACE("RegisterWorker with an unknown device kind");
    v1::RegisterWorkerRequest request = FakeWorker("worker-e");
    *request.mutable_devices(0) =
        DeviceOf(static_cast<v1::DeviceKind>(kUnknownEnum));
    EXPECT_THAT(RegisterWorker(*stub_, request),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("unknown device kind 42")));
    expect_unchanged();
  }
  {
    SCOPED_TRACE("RegisterWorker with a device without distributed support");
    v1::RegisterWorkerRequest request = FakeWorker("worker-e");
    *request.add_devices() = DeviceOf(v1::DEVICE_KIND_VULKAN);
    EXPECT_THAT(RegisterWorker(*stub_, request),
                StatusIs(absl::StatusCode::kUnimplemented,
                         HasSubstr("Distributed operations are not supported "
                                   "for device Vulkan(0)")));
    expect_unchanged();
  }
  {
    SCOPED_TRACE("RegisterWorker without a name");
    EXPECT_THAT(RegisterWorker(*stub_, FakeWorker("")),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("worker name must not be empty")));
    expect_unchanged();
  }
  auto heartbeat = [&](uint64_t id, uint64_t incarnation) {
    grpc::ClientContext context;
    context.set_deadline(DeadlineAfter(kRpcTimeout));
    v1::HeartbeatRequest request;
    request.set_worker_id(id);
    request.set_incarnation(incarnation);
    v1::HeartbeatResponse response;
    return FromGrpcStatus(stub_->Heartbeat(&context, request, &response));
  };
  EXPECT_THAT(heartbeat(999999, 7), StatusIs(absl::StatusCode::kNotFound,
                                             HasSubstr("unknown worker id")));
  EXPECT_THAT(heartbeat(worker_ids_[0], 8),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("belongs to incarnation 7, not 8")));
  {
    grpc::ClientContext context;
    context.set_deadline(DeadlineAfter(kRpcTimeout));
    v1::DeregisterRequest request;
    request.set_worker_id(999999);
    request.set_incarnation(7);
    v1::DeregisterResponse response;
    EXPECT_THAT(
        FromGrpcStatus(stub_->Deregister(&context, request, &response)),
        StatusIs(absl::StatusCode::kNotFound, HasSubstr("unknown worker id")));
  }
  expect_unchanged();

  auto commit = [&](const std::string& group, uint64_t at, int rank,
                    uint64_t sequence) {
    grpc::ClientContext context;
    context.set_deadline(DeadlineAfter(kRpcTimeout));
    v1::CommitRequest request;
    request.set_group(group);
    request.set_epoch(at);
    request.set_rank(rank);
    request.set_sequence(sequence);
    v1::CommitResponse response;
    return FromGrpcStatus(stub_->Commit(&context, request, &response));
  };
  EXPECT_THAT(
      commit("no-such-group", epoch, 0, 1),
      StatusIs(absl::StatusCode::kNotFound, HasSubstr("unknown group")));
  EXPECT_THAT(commit("other", stale_epoch, 0, 1),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("stale epoch")));
  EXPECT_THAT(commit("other", epoch, 5, 1),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("rank 5 is out of range")));
  EXPECT_THAT(commit("other", epoch, 0, 1),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("has nothing to commit")));
  expect_unchanged();

  auto report = [&](const std::string& group, uint64_t at) {
    grpc::ClientContext context;
    context.set_deadline(DeadlineAfter(kRpcTimeout));
    v1::ReportFailureRequest request;
    request.set_group(group);
    request.set_epoch(at);
    request.set_rank(0);
    request.set_sequence(1);
    request.set_code(static_cast<int>(absl::StatusCode::kUnavailable));
    request.set_message("peer gone");
    v1::ReportFailureResponse response;
    return FromGrpcStatus(stub_->ReportFailure(&context, request, &response));
  };
  EXPECT_THAT(
      report("no-such-group", epoch),
      StatusIs(absl::StatusCode::kNotFound, HasSubstr("unknown group")));
  EXPECT_THAT(report("other", stale_epoch),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("stale epoch")));
  expect_unchanged();
}

}  // namespace
}  // namespace chorus::test
