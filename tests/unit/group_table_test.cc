#include "server/coordinator/group_table.h"

#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_detail.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/fake_clock.h"

namespace chorus {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::Pair;
using ::testing::SizeIs;
using ::testing::StartsWith;
using ::testing::UnorderedElementsAre;

constexpr int kWorkers = 8;
constexpr char kVulkanRefusal[] =
    "Distributed operations are not supported for device Vulkan(0)";

Device Dev(DeviceKind kind, int index = 0) {
  Device d;
  d.kind = kind;
  d.index = index;
  return d;
}

Device Cpu() { return Dev(DeviceKind::kCpu); }

std::string Message(const absl::Status& status) {
  return std::string(status.message());
}

// Records every run of a callback. Lives at a fixed address: the callback
// points at it.
template <typename T>
class Waiter {
 public:
  Waiter() = default;
  Waiter(const Waiter&) = delete;
  Waiter& operator=(const Waiter&) = delete;

  std::function<void(absl::StatusOr<T>)> Callback() {
    return [this](absl::StatusOr<T> result) {
      ++calls_;
      result_ = std::move(result);
    };
  }

  int calls() const { return calls_; }
  bool done() const { return calls_ > 0; }
  absl::Status status() const {
    return result_ ? result_->status() : absl::UnknownError("not done");
  }
  const T& value() const { return **result_; }

 private:
  int calls_ = 0;
  std::optional<absl::StatusOr<T>> result_;
};

using JoinWaiter = Waiter<GroupView>;
using CallWaiter = Waiter<CollectiveOutcome>;

CollectiveSpec Spec(CollectiveKind kind, DType dtype, uint64_t count,
                    ReduceOp op = ReduceOp::kSum, int32_t root = 0) {
  CollectiveSpec spec;
  spec.kind = kind;
  spec.dtype = dtype;
  spec.count = count;
  spec.op = op;
  spec.root = root;
  return spec;
}

CollectiveSpec AllReduce(DType dtype, uint64_t count,
                         ReduceOp op = ReduceOp::kSum) {
  return Spec(CollectiveKind::kAllReduce, dtype, count, op);
}

CollectiveSpec Barrier() {
  CollectiveSpec spec;
  spec.kind = CollectiveKind::kBarrier;
  return spec;
}

// The input of `rank` for call `sequence`: element i is
// sequence * 1000 + rank * 100 + i (exact in f32 and i32).
std::vector<int64_t> InputValues(const CollectiveSpec& spec, int world,
                                 int rank, uint64_t sequence) {
  std::vector<int64_t> values(InputBytes(spec, world, rank) /
                              DTypeSize(spec.dtype));
  for (size_t i = 0; i < values.size(); ++i) {
    values[i] = static_cast<int64_t>(sequence) * 1000 + rank * 100 + i;
  }
  return values;
}

std::string Encode(DType dtype, const std::vector<int64_t>& values) {
  std::string bytes;
  for (int64_t v : values) {
    if (dtype == DType::kF32) {
      const float f = static_cast<float>(v);
      bytes.append(reinterpret_cast<const char*>(&f), sizeof(f));
    } else if (dtype == DType::kI32) {
      const int32_t i = static_cast<int32_t>(v);
      bytes.append(reinterpret_cast<const char*>(&i), sizeof(i));
    } else {
      ADD_FAILURE() << "tests encode f32 and i32 only";
    }
  }
  return bytes;
}

// What rank `rank` must receive for the sums, gathers and broadcasts these
// tests run, computed from InputValues.
std::string Expected(const CollectiveSpec& spec, int world, int rank,
                     uint64_t sequence) {
  std::vector<int64_t> out;
  switch (spec.kind) {
    case CollectiveKind::kAllReduce:
      EXPECT_EQ(spec.op, ReduceOp::kSum);
      out.assign(spec.count, 0);
      for (int r = 0; r < world; ++r) {
        std::vector<int64_t> in = InputValues(spec, world, r, sequence);
        for (size_t i = 0; i < out.size(); ++i) out[i] += in[i];
      }
      break;
    case CollectiveKind::kAllGather:
      for (int r = 0; r < world; ++r) {
        std::vector<int64_t> in = InputValues(spec, world, r, sequence);
        out.insert(out.end(), in.begin(), in.end());
      }
      break;
    case CollectiveKind::kBroadcast:
      out = InputValues(spec, world, spec.root, sequence);
      break;
    case CollectiveKind::kBarrier:
      break;
    default:
      ADD_FAILURE() << "no expectation for " << DescribeSpec(spec);
  }
  (void)rank;
  return Encode(spec.dtype, out);
}

class GroupTableTest : public ::testing::Test {
 protected:
  GroupTableTest() : registry_(&clock_, absl::Hours(1)) {
    for (int i = 0; i < kWorkers; ++i) {
      WorkerRegistration r;
      r.name = absl::StrCat("w", i);
      r.host = absl::StrCat("host-", i);
      r.address = absl::StrCat("10.0.0.", i, ":7100");
      r.incarnation = 1;
      r.devices = {Cpu()};
      absl::StatusOr<RegisterResult> result = registry_.Register(r);
      EXPECT_TRUE(result.ok()) << result.status();
      workers_.push_back(result->worker_id);
    }
    GroupTableOptions options;
    options.max_world_size = 16;
    table_ = std::make_unique<GroupTable>(&clock_, &registry_, options);
  }

  // A join of `rank` by worker w<rank>; `timeout` from now.
  JoinRequest Req(const std::string& group, int world, int rank,
                  absl::Duration timeout = absl::InfiniteDuration()) {
    JoinRequest request;
    request.group = group;
    request.world_size = world;
    request.rank = rank;
    request.worker_id = workers_[(rank % kWorkers + kWorkers) % kWorkers];
    request.device = Cpu();
    request.deadline = timeout == absl::InfiniteDuration()
                           ? absl::InfiniteFuture()
                           : clock_.Now() + timeout;
    return request;
  }

  // Joins every rank; returns the view all of them got.
  GroupView Form(const std::string& group, int world) {
    std::vector<JoinWaiter> waiters(world);
    for (int rank = 0; rank < world; ++rank) {
      table_->Join(Req(group, world, rank), waiters[rank].Callback());
    }
    for (int rank = 0; rank < world; ++rank) {
      EXPECT_EQ(waiters[rank].calls(), 1) << rank;
      EXPECT_TRUE(waiters[rank].status().ok()) << waiters[rank].status();
    }
    if (!waiters[0].status().ok()) return GroupView();
    return waiters[0].value();
  }

  // The call of `rank`, with its input attached when the spec rides inline.
  CollectiveCall Call(const GroupView& view, int rank, uint64_t sequence,
                      const CollectiveSpec& spec,
                      Algorithm forced = Algorithm::kUnspecified,
                      absl::Duration timeout = absl::InfiniteDuration()) {
    CollectiveCall call;
    call.group = view.name;
    call.epoch = view.epoch;
    call.rank = rank;
    call.sequence = sequence;
    call.spec = spec;
    call.algorithm = forced;
    if (CarriesInlineData(spec, view.world_size, forced,
                          table_->options().planner.inline_max_bytes)) {
      call.has_data = true;
      call.data = Encode(spec.dtype,
                         InputValues(spec, view.world_size, rank, sequence));
    }
    call.deadline = timeout == absl::InfiniteDuration()
                        ? absl::InfiniteFuture()
                        : clock_.Now() + timeout;
    return call;
  }

  // Every rank calls `spec` as call `sequence`, in rank order; returns the
  // waiters (all answered).
  std::unique_ptr<std::vector<CallWaiter>> CallAll(
      const GroupView& view, uint64_t sequence, const CollectiveSpec& spec,
      Algorithm forced = Algorithm::kUnspecified) {
    auto waiters = std::make_unique<std::vector<CallWaiter>>(view.world_size);
    for (int rank = 0; rank < view.world_size; ++rank) {
      table_->Collective(Call(view, rank, sequence, spec, forced),
                         (*waiters)[rank].Callback());
    }
    for (int rank = 0; rank < view.world_size; ++rank) {
      EXPECT_EQ((*waiters)[rank].calls(), 1) << "rank " << rank;
    }
    return waiters;
  }

  // Checks that every rank got the inline result of `spec`.
  void ExpectInlineResults(const std::vector<CallWaiter>& waiters,
                           const GroupView& view, uint64_t sequence,
                           const CollectiveSpec& spec) {
    for (int rank = 0; rank < view.world_size; ++rank) {
      SCOPED_TRACE(absl::StrCat("rank ", rank, " #", sequence));
      ASSERT_EQ(waiters[rank].calls(), 1);
      ASSERT_TRUE(waiters[rank].status().ok()) << waiters[rank].status();
      const CollectiveOutcome& outcome = waiters[rank].value();
      EXPECT_EQ(outcome.sequence, sequence);
      EXPECT_EQ(outcome.plan.algorithm, Algorithm::kInline);
      EXPECT_EQ(outcome.data, Expected(spec, view.world_size, rank, sequence));
    }
  }

  GroupSummary Summary(const std::string& name) {
    for (const GroupSummary& summary : table_->List()) {
      if (summary.view.name == name) return summary;
    }
    ADD_FAILURE() << "no group " << name;
    return GroupSummary();
  }

  FakeClock clock_;
  Registry registry_;
  std::vector<uint64_t> workers_;
  std::unique_ptr<GroupTable> table_;
};

// ---- Join ------------------------------------------------------------------

TEST_F(GroupTableTest, Join_AllRanksJoin_EveryRankGetsSameView) {
  std::vector<JoinWaiter> waiters(4);
  for (int rank : {2, 0, 3}) {
    table_->Join(Req("g", 4, rank), waiters[rank].Callback());
  }
  for (const JoinWaiter& w : waiters) EXPECT_FALSE(w.done());
  EXPECT_THAT(table_->List(), IsEmpty());

  table_->Join(Req("g", 4, 1), waiters[1].Callback());
  for (int rank = 0; rank < 4; ++rank) {
    SCOPED_TRACE(rank);
    ASSERT_EQ(waiters[rank].calls(), 1);
    ASSERT_TRUE(waiters[rank].status().ok()) << waiters[rank].status();
    const GroupView& view = waiters[rank].value();
    EXPECT_EQ(view.name, "g");
    EXPECT_EQ(view.epoch, 1u);
    EXPECT_EQ(view.world_size, 4);
    ASSERT_THAT(view.members, SizeIs(4));
    for (int m = 0; m < 4; ++m) {
      const GroupMember& member = view.members[m];
      EXPECT_EQ(member.rank, m);
      EXPECT_EQ(member.worker_id, workers_[m]);
      EXPECT_EQ(member.worker_name, absl::StrCat("w", m));
      EXPECT_EQ(member.host, absl::StrCat("host-", m));
      EXPECT_EQ(member.address, absl::StrCat("10.0.0.", m, ":7100"));
      EXPECT_EQ(member.device.kind, DeviceKind::kCpu);
    }
  }
  const std::vector<GroupSummary> groups = table_->List();
  ASSERT_THAT(groups, SizeIs(1));
  EXPECT_EQ(groups[0].view.name, "g");
  EXPECT_EQ(groups[0].view.epoch, 1u);
  EXPECT_EQ(groups[0].completed, 0u);
  EXPECT_EQ(groups[0].pending_sequence, 0u);
  EXPECT_EQ(table_->NextDeadline(), absl::InfiniteFuture());
}

TEST_F(GroupTableTest, Join_AllRanksJoin_EveryCallbackGetsOneSharedView) {
  // The view lists every member, so ranks share one copy rather than each
  // getting its own (a group of N ranks would otherwise copy N * N members).
  constexpr int kWorld = 4;
  // Where each callback's view lives, noted while it is alive.
  std::vector<uintptr_t> seen(kWorld, 0);
  for (int rank = 0; rank < kWorld; ++rank) {
    table_->Join(Req("g", kWorld, rank),
                 [&seen, rank](const absl::StatusOr<GroupView>& view) {
                   ASSERT_TRUE(view.ok()) << view.status();
                   EXPECT_THAT(view->members, SizeIs(4));
                   seen[rank] = reinterpret_cast<uintptr_t>(&*view);
                 });
  }
  for (int rank = 0; rank < kWorld; ++rank) {
    ASSERT_NE(seen[rank], 0u) << rank;
    EXPECT_EQ(seen[rank], seen[0]) << rank;
  }
}

TEST_F(GroupTableTest, Join_WorldSizeOne_FormsAtOnce) {
  JoinWaiter w;
  table_->Join(Req("solo", 1, 0), w.Callback());
  ASSERT_EQ(w.calls(), 1);
  ASSERT_TRUE(w.status().ok()) << w.status();
  EXPECT_THAT(w.value().members, SizeIs(1));
}

TEST_F(GroupTableTest, Join_MemberDevice_CarriesRegisteredDetails) {
  WorkerRegistration r;
  r.name = "gpu";
  r.host = "host-gpu";
  r.address = "gpu:7100";
  r.cuda_support = true;
  Device cuda = Dev(DeviceKind::kCuda, 0);
  cuda.model = "NVIDIA H200";
  cuda.memory_bytes = uint64_t{141} << 30;
  r.devices = {Cpu(), cuda};
  const uint64_t id = registry_.Register(r)->worker_id;

  JoinWaiter w0, w1;
  table_->Join(Req("g", 2, 0), w0.Callback());
  JoinRequest request = Req("g", 2, 1);
  request.worker_id = id;
  request.device = Dev(DeviceKind::kCuda, 0);  // no details given
  table_->Join(request, w1.Callback());
  ASSERT_TRUE(w1.status().ok()) << w1.status();
  const GroupMember& member = w1.value().members[1];
  EXPECT_EQ(member.worker_name, "gpu");
  EXPECT_EQ(member.device.kind, DeviceKind::kCuda);
  EXPECT_EQ(member.device.model, "NVIDIA H200");
  EXPECT_EQ(member.device.memory_bytes, uint64_t{141} << 30);
}

TEST_F(GroupTableTest, Join_SameGroupAgain_NewEpochAndOldCallsAborted) {
  const GroupView v1 = Form("g", 2);
  ASSERT_EQ(v1.epoch, 1u);
  CallWaiter pending;
  table_->Collective(Call(v1, 0, 1, AllReduce(DType::kI32, 4)),
                     pending.Callback());
  EXPECT_FALSE(pending.done());

  const GroupView v2 = Form("g", 2);
  EXPECT_EQ(v2.epoch, 2u);
  ASSERT_EQ(pending.calls(), 1);
  EXPECT_EQ(pending.status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(Message(pending.status()),
            "group g was formed again at epoch 2; call again with the new "
            "epoch");

  // The old epoch is refused; the new one counts from 1 again.
  CallWaiter stale;
  table_->Collective(Call(v1, 1, 1, AllReduce(DType::kI32, 4)),
                     stale.Callback());
  ASSERT_EQ(stale.calls(), 1);
  EXPECT_EQ(stale.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Message(stale.status()),
            "stale epoch 1 for group g, which is at epoch 2; join again");

  auto waiters = CallAll(v2, 1, AllReduce(DType::kI32, 4));
  ExpectInlineResults(*waiters, v2, 1, AllReduce(DType::kI32, 4));
  EXPECT_EQ(Summary("g").view.epoch, 2u);
  EXPECT_EQ(Summary("g").completed, 1u);

  EXPECT_EQ(Form("g", 3).epoch, 3u);
}

TEST_F(GroupTableTest, Members_AskedRanks_InOrderElseClearRefusal) {
  const GroupView v1 = Form("g", 3);
  absl::StatusOr<std::vector<GroupMember>> members =
      table_->Members("g", v1.epoch, {2, 0});
  ASSERT_TRUE(members.ok()) << members.status();
  ASSERT_EQ(members->size(), 2u);
  EXPECT_EQ((*members)[0].rank, 2);
  EXPECT_EQ((*members)[0].worker_name, v1.members[2].worker_name);
  EXPECT_EQ((*members)[1].address, v1.members[0].address);
  EXPECT_EQ(table_->Members("h", 1, {0}).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(table_->Members("g", v1.epoch, {3}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(table_->Members("g", v1.epoch, {-1}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(table_->Members("g", v1.epoch, {0, 1, 2, 0}).status().code(),
            absl::StatusCode::kInvalidArgument);
  const GroupView v2 = Form("g", 3);
  const absl::Status stale = table_->Members("g", v1.epoch, {0}).status();
  EXPECT_EQ(stale.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Message(stale), absl::StrCat("stale epoch ", v1.epoch,
                                         " for group g, which is at "
                                         "epoch ",
                                         v2.epoch, "; join again"));
  // Asking changed nothing: the group still runs its calls.
  auto waiters = CallAll(v2, 1, AllReduce(DType::kI32, 4));
  ExpectInlineResults(*waiters, v2, 1, AllReduce(DType::kI32, 4));
}

TEST_F(GroupTableTest, Join_ReformationInProgress_OldEpochStillServes) {
  const GroupView v1 = Form("g", 2);
  JoinWaiter j0;
  table_->Join(Req("g", 2, 0), j0.Callback());
  EXPECT_FALSE(j0.done());
  auto waiters = CallAll(v1, 1, AllReduce(DType::kF32, 3));
  ExpectInlineResults(*waiters, v1, 1, AllReduce(DType::kF32, 3));

  JoinWaiter j1;
  table_->Join(Req("g", 2, 1), j1.Callback());
  ASSERT_TRUE(j0.status().ok());
  EXPECT_EQ(j0.value().epoch, 2u);
}

struct BadJoin {
  std::string label;
  JoinRequest request;
  absl::StatusCode code;
  std::string message;
};

TEST_F(GroupTableTest, Join_InvalidRequests_RefusedAndFormationUnchanged) {
  std::vector<JoinWaiter> good(4);
  table_->Join(Req("g", 4, 0), good[0].Callback());
  table_->Join(Req("g", 4, 1), good[1].Callback());

  std::vector<BadJoin> cases = {
      {"world size 0", Req("g", 0, 0), absl::StatusCode::kInvalidArgument,
       "world size 0 of group g is out of range [1, 16]"},
      {"negative world size", Req("g", -2, 0),
       absl::StatusCode::kInvalidArgument,
       "world size -2 of group g is out of range [1, 16]"},
      {"world size over max", Req("g", 17, 2),
       absl::StatusCode::kInvalidArgument,
       "world size 17 of group g is out of range [1, 16]"},
      {"rank == world size", Req("g", 4, 4), absl::StatusCode::kInvalidArgument,
       "rank 4 is out of range for group g of world size 4"},
      {"negative rank", Req("g", 4, -1), absl::StatusCode::kInvalidArgument,
       "rank -1 is out of range for group g of world size 4"},
      {"duplicate rank", Req("g", 4, 1), absl::StatusCode::kInvalidArgument,
       absl::StrCat("rank 1 of group g was already joined by worker \"w1\" "
                    "(id ",
                    workers_[1], ")")},
      {"other world size", Req("g", 3, 2), absl::StatusCode::kInvalidArgument,
       "group g is forming with world size 4; rank 2 asked for 3"},
      {"empty group", Req("", 4, 2), absl::StatusCode::kInvalidArgument,
       "group name must not be empty"},
  };
  cases[5].request.worker_id = workers_[5];  // another worker claims rank 1
  {
    JoinRequest r = Req("g", 4, 2);
    r.worker_id = 9999;
    // Not bad input: a join that came right after a coordinator restart.
    cases.push_back({"unknown worker", r, absl::StatusCode::kUnavailable,
                     "the coordinator does not know worker id 9999 (it "
                     "restarted, or the worker's lease ran out); the worker "
                     "is registering again"});
  }
  {
    JoinRequest r = Req("g", 4, 2);
    r.device = Dev(static_cast<DeviceKind>(99));
    cases.push_back({"malformed device", r, absl::StatusCode::kInvalidArgument,
                     "unknown device kind 99"});
  }
  // A join refused for its device is not in this table: it fails the
  // waiting ranks too (Join_RankRefusedForDevice_...).

  for (const BadJoin& c : cases) {
    JoinWaiter w;
    table_->Join(c.request, w.Callback());
    ASSERT_EQ(w.calls(), 1) << c.label;
    EXPECT_EQ(w.status().code(), c.code) << c.label;
    EXPECT_EQ(Message(w.status()), c.message) << c.label;
    EXPECT_FALSE(good[0].done()) << c.label;
    EXPECT_FALSE(good[1].done()) << c.label;
  }

  table_->Join(Req("g", 4, 2), good[2].Callback());
  table_->Join(Req("g", 4, 3), good[3].Callback());
  for (int rank = 0; rank < 4; ++rank) {
    ASSERT_EQ(good[rank].calls(), 1) << rank;
    ASSERT_TRUE(good[rank].status().ok()) << good[rank].status();
    EXPECT_EQ(good[rank].value().epoch, 1u);
    EXPECT_EQ(good[rank].value().world_size, 4);
    EXPECT_EQ(good[rank].value().members[1].worker_id, workers_[1]);
  }
}

// A worker id the registry does not hold (after a coordinator restart the
// worker registers again on its own) is refused as UNAVAILABLE, worth
// trying again, and leaves the formation as it was.
TEST_F(GroupTableTest,
       Join_UnknownOrDeregisteredWorker_UnavailableRegistering) {
  JoinWaiter w0;
  table_->Join(Req("g", 2, 0), w0.Callback());

  JoinRequest unknown = Req("g", 2, 1);
  unknown.worker_id = 12345;
  JoinWaiter refused;
  table_->Join(unknown, refused.Callback());
  ASSERT_EQ(refused.calls(), 1);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(refused.status().message()),
              ::testing::HasSubstr("the worker is registering again"));

  ASSERT_TRUE(registry_.Deregister(workers_[7], 1).ok());
  JoinRequest gone = Req("g", 2, 1);
  gone.worker_id = workers_[7];
  JoinWaiter refused_again;
  table_->Join(gone, refused_again.Callback());
  ASSERT_EQ(refused_again.calls(), 1);
  EXPECT_EQ(refused_again.status().code(), absl::StatusCode::kUnavailable);

  JoinWaiter w1;
  table_->Join(Req("g", 2, 1), w1.Callback());
  EXPECT_TRUE(w0.status().ok()) << w0.status();
  EXPECT_TRUE(w1.status().ok()) << w1.status();
}

TEST_F(GroupTableTest, Join_UnsupportedDevice_UnimplementedExactMessage) {
  JoinWaiter w0;
  table_->Join(Req("g", 2, 0), w0.Callback());

  struct Refusal {
    Device device;
    std::string message;
  };
  Device npu;
  npu.kind = DeviceKind::kOther;
  npu.other_kind = "Npu";
  npu.index = 2;
  const std::vector<Refusal> refusals = {
      {Dev(DeviceKind::kVulkan, 0), kVulkanRefusal},
      {Dev(DeviceKind::kWgpu, 0),
       "Distributed operations are not supported for device Wgpu(0)"},
      {npu, "Distributed operations are not supported for device Npu(2)"},
      {Dev(DeviceKind::kCuda, 0),
       "Distributed operations are not supported for device Cuda(0): this "
       "worker was built without CUDA"},
  };
  for (const Refusal& r : refusals) {
    JoinRequest request = Req("g", 2, 1);
    request.device = r.device;
    JoinWaiter w;
    table_->Join(request, w.Callback());
    ASSERT_EQ(w.calls(), 1) << r.message;
    EXPECT_EQ(w.status().code(), absl::StatusCode::kUnimplemented);
    EXPECT_EQ(Message(w.status()), r.message);
  }
  // The waiting rank heard of the first refusal.
  ASSERT_EQ(w0.calls(), 1);
  EXPECT_EQ(w0.status().code(), absl::StatusCode::kFailedPrecondition);

  // Rank 1 on a supported device clears its refusal; the group forms.
  JoinWaiter w1;
  table_->Join(Req("g", 2, 1), w1.Callback());
  JoinWaiter w0_again;
  table_->Join(Req("g", 2, 0), w0_again.Callback());
  EXPECT_TRUE(w0_again.status().ok()) << w0_again.status();
  EXPECT_TRUE(w1.status().ok()) << w1.status();
}

TEST_F(GroupTableTest, ExpireDeadlines_RankThatGaveUp_NotNamedAsMissing) {
  JoinWaiter w0, w3;
  table_->Join(Req("g", 4, 0, absl::Seconds(3)), w0.Callback());
  clock_.Advance(absl::Milliseconds(700));
  table_->Join(Req("g", 4, 3, absl::Seconds(3)), w3.Callback());
  clock_.Advance(absl::Milliseconds(2300));
  table_->ExpireDeadlines();
  ASSERT_EQ(w0.calls(), 1);
  EXPECT_EQ(w0.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(Message(w0.status()),
            "ranks 1, 2 of group g did not join within the deadline (world "
            "size 4)");
  EXPECT_FALSE(w3.done());
  clock_.Advance(absl::Milliseconds(700));
  table_->ExpireDeadlines();
  ASSERT_EQ(w3.calls(), 1);
  EXPECT_EQ(Message(w3.status()),
            "ranks 1, 2 of group g did not join within the deadline (world "
            "size 4); rank 0 joined but left at its own deadline");
}

TEST_F(GroupTableTest,
       Join_RankRefusedForDevice_WaitingRanksFailedPreconditionAtOnce) {
  JoinWaiter w0, w2;
  table_->Join(Req("g", 3, 0, absl::Seconds(30)), w0.Callback());
  table_->Join(Req("g", 3, 2, absl::Seconds(30)), w2.Callback());
  JoinRequest vulkan = Req("g", 3, 1, absl::Seconds(30));
  vulkan.device = Dev(DeviceKind::kVulkan, 0);
  JoinWaiter w1;
  table_->Join(vulkan, w1.Callback());
  ASSERT_EQ(w1.calls(), 1);
  EXPECT_EQ(w1.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(Message(w1.status()), kVulkanRefusal);
  // No time passed: the others know at once, naming the rank and device.
  for (JoinWaiter* w : {&w0, &w2}) {
    ASSERT_EQ(w->calls(), 1);
    EXPECT_EQ(w->status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ(Message(w->status()),
              absl::StrCat("rank 1 of group g was refused: ", kVulkanRefusal,
                           "; the group cannot form until that rank joins "
                           "on a device with distributed support"));
  }
}

TEST_F(GroupTableTest, Join_AfterRefusal_LaterRanksRefusedUntilItExpires) {
  JoinRequest vulkan = Req("g", 2, 1, absl::Seconds(10));
  vulkan.device = Dev(DeviceKind::kVulkan, 0);
  JoinWaiter refused;
  table_->Join(vulkan, refused.Callback());
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kUnimplemented);

  JoinWaiter late;
  table_->Join(Req("g", 2, 0, absl::Seconds(60)), late.Callback());
  ASSERT_EQ(late.calls(), 1);
  EXPECT_EQ(late.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(Message(late.status()).find("Vulkan(0)"), std::string::npos);

  // The refusal lasts as long as the refused join's deadline.
  EXPECT_EQ(table_->NextDeadline(), clock_.Now() + absl::Seconds(10));
  clock_.Advance(absl::Seconds(11));
  table_->ExpireDeadlines();
  JoinWaiter later;
  table_->Join(Req("g", 2, 0, absl::Seconds(60)), later.Callback());
  EXPECT_FALSE(later.done());
  JoinWaiter w1;
  table_->Join(Req("g", 2, 1, absl::Seconds(60)), w1.Callback());
  EXPECT_TRUE(later.status().ok()) << later.status();
  EXPECT_TRUE(w1.status().ok()) << w1.status();
}

TEST_F(GroupTableTest, Join_DeviceNotRegistered_Unimplemented) {
  WorkerRegistration r;
  r.name = "gpu";
  r.host = "h";
  r.address = "gpu:7100";
  r.cuda_support = true;
  r.devices = {Dev(DeviceKind::kCuda, 0)};
  const uint64_t id = registry_.Register(r)->worker_id;
  JoinRequest request = Req("g", 2, 0);
  request.worker_id = id;
  request.device = Dev(DeviceKind::kCuda, 1);
  JoinWaiter w;
  table_->Join(request, w.Callback());
  ASSERT_EQ(w.calls(), 1);
  EXPECT_EQ(w.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(Message(w.status()),
            "Distributed operations are not supported for device Cuda(1): "
            "worker \"gpu\" did not register it");
}

TEST_F(GroupTableTest, Join_DeadlinePasses_DeadlineExceededNamingMissingRanks) {
  EXPECT_EQ(table_->NextDeadline(), absl::InfiniteFuture());
  const absl::Time start = clock_.Now();
  JoinWaiter w0, w1;
  table_->Join(Req("g", 4, 0, absl::Seconds(5)), w0.Callback());
  table_->Join(Req("g", 4, 1, absl::Seconds(5)), w1.Callback());
  EXPECT_EQ(table_->NextDeadline(), start + absl::Seconds(5));

  clock_.Advance(absl::Seconds(5) - absl::Milliseconds(1));
  table_->ExpireDeadlines();
  EXPECT_FALSE(w0.done());
  EXPECT_FALSE(w1.done());

  clock_.Advance(absl::Milliseconds(1));
  table_->ExpireDeadlines();
  for (JoinWaiter* w : {&w0, &w1}) {
    ASSERT_EQ(w->calls(), 1);
    EXPECT_EQ(w->status().code(), absl::StatusCode::kDeadlineExceeded);
    EXPECT_EQ(Message(w->status()),
              "ranks 2, 3 of group g did not join within the deadline (world "
              "size 4)");
  }
  EXPECT_EQ(table_->NextDeadline(), absl::InfiniteFuture());
  EXPECT_THAT(table_->List(), IsEmpty());
  table_->ExpireDeadlines();
  EXPECT_EQ(w0.calls(), 1);

  // The formation is gone: the group may now form with another world size.
  EXPECT_EQ(Form("g", 2).epoch, 1u);
}

TEST_F(GroupTableTest, Join_OneRankExpires_OthersKeepWaiting) {
  const absl::Time start = clock_.Now();
  JoinWaiter w0, w2;
  table_->Join(Req("g", 3, 0, absl::Seconds(1)), w0.Callback());
  table_->Join(Req("g", 3, 2, absl::Seconds(10)), w2.Callback());
  EXPECT_EQ(table_->NextDeadline(), start + absl::Seconds(1));

  clock_.Advance(absl::Seconds(1));
  table_->ExpireDeadlines();
  ASSERT_EQ(w0.calls(), 1);
  EXPECT_EQ(w0.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(Message(w0.status()),
            "rank 1 of group g did not join within the deadline (world size "
            "3)");
  EXPECT_FALSE(w2.done());
  EXPECT_EQ(table_->NextDeadline(), start + absl::Seconds(10));

  // Rank 0's slot is free again.
  JoinWaiter again0, w1;
  table_->Join(Req("g", 3, 0), again0.Callback());
  table_->Join(Req("g", 3, 1), w1.Callback());
  for (JoinWaiter* w : {&again0, &w1, &w2}) {
    ASSERT_EQ(w->calls(), 1);
    EXPECT_TRUE(w->status().ok()) << w->status();
  }
  EXPECT_EQ(table_->NextDeadline(), absl::InfiniteFuture());
}

// ---- Collective: matching --------------------------------------------------

TEST_F(GroupTableTest, Collective_AllRanksCall_OneVerdictPerRank) {
  const GroupView view = Form("g", 4);
  const CollectiveSpec spec = AllReduce(DType::kI32, 5);
  std::vector<CallWaiter> waiters(4);
  for (int rank : {3, 1, 0}) {
    table_->Collective(Call(view, rank, 1, spec), waiters[rank].Callback());
  }
  for (const CallWaiter& w : waiters) EXPECT_FALSE(w.done());
  table_->Collective(Call(view, 2, 1, spec), waiters[2].Callback());
  ExpectInlineResults(waiters, view, 1, spec);
  EXPECT_EQ(waiters[0].value().plan.chunk_bytes,
            table_->options().planner.chunk_bytes);

  table_->ExpireDeadlines();
  table_->AbortAll(absl::CancelledError("later"));
  for (const CallWaiter& w : waiters) EXPECT_EQ(w.calls(), 1);
}

TEST_F(GroupTableTest, Collective_NthCallsOfEachRank_MatchedTogether) {
  const GroupView view = Form("g", 3);
  const CollectiveSpec specs[] = {
      AllReduce(DType::kI32, 2),
      Spec(CollectiveKind::kAllGather, DType::kI32, 3),
      Spec(CollectiveKind::kBroadcast, DType::kF32, 4, ReduceOp::kSum, 2),
  };
  // waiters[rank][sequence - 1]
  std::vector<CallWaiter> w(9);
  auto at = [&w](int rank, int sequence) -> CallWaiter& {
    return w[rank * 3 + sequence - 1];
  };
  auto call = [&](int rank, int sequence) {
    table_->Collective(Call(view, rank, sequence, specs[sequence - 1]),
                       at(rank, sequence).Callback());
  };
  call(0, 1);
  call(0, 2);
  call(0, 3);
  call(1, 1);
  call(1, 2);
  for (CallWaiter& waiter : w) EXPECT_FALSE(waiter.done());

  call(2, 1);
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_TRUE(at(rank, 1).done()) << rank;
    EXPECT_FALSE(at(rank, 2).done()) << rank;
  }
  GroupSummary summary = Summary("g");
  EXPECT_EQ(summary.completed, 1u);
  EXPECT_EQ(summary.pending_sequence, 2u);
  EXPECT_THAT(summary.missing_ranks, ElementsAre(2));

  call(2, 2);
  call(1, 3);
  EXPECT_FALSE(at(0, 3).done());
  call(2, 3);
  for (int sequence = 1; sequence <= 3; ++sequence) {
    for (int rank = 0; rank < 3; ++rank) {
      SCOPED_TRACE(absl::StrCat("rank ", rank, " #", sequence));
      CallWaiter& waiter = at(rank, sequence);
      ASSERT_EQ(waiter.calls(), 1);
      ASSERT_TRUE(waiter.status().ok()) << waiter.status();
      EXPECT_EQ(waiter.value().sequence, static_cast<uint64_t>(sequence));
      EXPECT_EQ(waiter.value().data,
                Expected(specs[sequence - 1], 3, rank, sequence));
    }
  }
  EXPECT_EQ(Summary("g").completed, 3u);
  EXPECT_EQ(Summary("g").pending_sequence, 0u);
}

TEST_F(GroupTableTest, Collective_RanksArriveInAnyOrder_EveryMatchCorrect) {
  constexpr int kWorld = 5;
  constexpr int kCalls = 40;
  const GroupView view = Form("g", kWorld);
  auto spec_of = [](int sequence) {
    switch (sequence % 3) {
      case 0:
        return AllReduce(DType::kI32, sequence % 7 + 1);
      case 1:
        return Spec(CollectiveKind::kAllGather, DType::kF32, 2);
      default:
        return Spec(CollectiveKind::kBroadcast, DType::kI32, 3,
                    ReduceOp::kUnspecified, sequence % kWorld);
    }
  };
  std::vector<CallWaiter> w(kWorld * kCalls);
  std::vector<int> next(kWorld, 1);
  std::vector<int> arrived(kCalls + 1, 0);
  std::mt19937 rng(20240601);
  int remaining = kWorld * kCalls;
  while (remaining > 0) {
    int rank = std::uniform_int_distribution<int>(0, kWorld - 1)(rng);
    while (next[rank] > kCalls) rank = (rank + 1) % kWorld;
    const int sequence = next[rank]++;
    --remaining;
    table_->Collective(Call(view, rank, sequence, spec_of(sequence)),
                       w[rank * kCalls + sequence - 1].Callback());
    ++arrived[sequence];
    for (int r = 0; r < kWorld; ++r) {
      ASSERT_EQ(w[r * kCalls + sequence - 1].done(),
                arrived[sequence] == kWorld)
          << "rank " << r << " #" << sequence;
    }
  }
  for (int sequence = 1; sequence <= kCalls; ++sequence) {
    for (int rank = 0; rank < kWorld; ++rank) {
      SCOPED_TRACE(absl::StrCat("rank ", rank, " #", sequence));
      const CallWaiter& waiter = w[rank * kCalls + sequence - 1];
      ASSERT_EQ(waiter.calls(), 1);
      ASSERT_TRUE(waiter.status().ok()) << waiter.status();
      EXPECT_EQ(waiter.value().sequence, static_cast<uint64_t>(sequence));
      EXPECT_EQ(waiter.value().data,
                Expected(spec_of(sequence), kWorld, rank, sequence));
    }
  }
  EXPECT_EQ(Summary("g").completed, static_cast<uint64_t>(kCalls));
}

TEST_F(GroupTableTest, Collective_CountMismatch_ExactPerRankAccount) {
  const GroupView view = Form("g", 2);
  CallWaiter w0, w1;
  table_->Collective(Call(view, 0, 1, AllReduce(DType::kF32, 1024)),
                     w0.Callback());
  table_->Collective(Call(view, 1, 1, AllReduce(DType::kF32, 2048)),
                     w1.Callback());
  for (CallWaiter* w : {&w0, &w1}) {
    ASSERT_EQ(w->calls(), 1);
    EXPECT_EQ(w->status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(Message(w->status()),
              "collective #1 of group g does not match across ranks: rank 0: "
              "all_reduce f32[1024] sum; rank 1: all_reduce f32[2048] sum");
    const std::optional<v1::ErrorDetail> detail = ErrorDetailOf(w->status());
    ASSERT_TRUE(detail.has_value());
    EXPECT_EQ(detail->reason(), "MISMATCH");
    EXPECT_EQ(detail->group(), "g");
    EXPECT_EQ(detail->epoch(), view.epoch);
    EXPECT_EQ(detail->sequence(), 1u);
    EXPECT_THAT(detail->ranks(),
                UnorderedElementsAre(Pair(0, "all_reduce f32[1024] sum"),
                                     Pair(1, "all_reduce f32[2048] sum")));
  }
}

TEST_F(GroupTableTest, Collective_MismatchOnOneRank_IdenticalRanksFolded) {
  const GroupView view = Form("g", 4);
  std::vector<CallWaiter> w(4);
  for (int rank = 0; rank < 4; ++rank) {
    table_->Collective(
        Call(view, rank, 1, AllReduce(DType::kF32, rank == 3 ? 2048 : 1024)),
        w[rank].Callback());
  }
  for (const CallWaiter& waiter : w) {
    ASSERT_EQ(waiter.calls(), 1);
    EXPECT_EQ(waiter.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(Message(waiter.status()),
              "collective #1 of group g does not match across ranks: ranks "
              "0-2: all_reduce f32[1024] sum; rank 3: all_reduce f32[2048] "
              "sum");
  }

  // Rank 0 the odd one out, as call #2.
  std::vector<CallWaiter> w2(4);
  for (int rank = 0; rank < 4; ++rank) {
    table_->Collective(
        Call(view, rank, 2,
             AllReduce(DType::kF32, 8,
                       rank == 0 ? ReduceOp::kMax : ReduceOp::kSum)),
        w2[rank].Callback());
  }
  EXPECT_EQ(Message(w2[2].status()),
            "collective #2 of group g does not match across ranks: rank 0: "
            "all_reduce f32[8] max; ranks 1-3: all_reduce f32[8] sum");
}

struct MismatchCase {
  std::string field;
  CollectiveSpec base;
  CollectiveSpec odd;
  Algorithm odd_algorithm = Algorithm::kUnspecified;
  std::string account;
};

TEST_F(GroupTableTest, Collective_MismatchOnAnyField_EveryRankInvalidArgument) {
  const GroupView view = Form("g", 3);
  const CollectiveSpec base = AllReduce(DType::kF32, 1024);
  const CollectiveSpec reduce =
      Spec(CollectiveKind::kReduce, DType::kF32, 16, ReduceOp::kSum, 0);
  std::vector<MismatchCase> cases = {
      {"kind", base, Spec(CollectiveKind::kAllGather, DType::kF32, 1024),
       Algorithm::kUnspecified,
       "ranks 0, 1: all_reduce f32[1024] sum; rank 2: all_gather f32[1024]"},
      {"dtype", base, AllReduce(DType::kI32, 1024), Algorithm::kUnspecified,
       "ranks 0, 1: all_reduce f32[1024] sum; rank 2: all_reduce i32[1024] "
       "sum"},
      {"count", base, AllReduce(DType::kF32, 2048), Algorithm::kUnspecified,
       "ranks 0, 1: all_reduce f32[1024] sum; rank 2: all_reduce f32[2048] "
       "sum"},
      {"op", base, AllReduce(DType::kF32, 1024, ReduceOp::kAvg),
       Algorithm::kUnspecified,
       "ranks 0, 1: all_reduce f32[1024] sum; rank 2: all_reduce f32[1024] "
       "avg"},
      {"root", reduce,
       Spec(CollectiveKind::kReduce, DType::kF32, 16, ReduceOp::kSum, 1),
       Algorithm::kUnspecified,
       "ranks 0, 1: reduce f32[16] sum root 0; rank 2: reduce f32[16] sum "
       "root 1"},
      {"algorithm", base, base, Algorithm::kRing,
       "ranks 0, 1: all_reduce f32[1024] sum; rank 2: all_reduce f32[1024] "
       "sum algorithm ring"},
  };
  uint64_t sequence = 0;
  for (const MismatchCase& c : cases) {
    ++sequence;
    std::vector<CallWaiter> w(3);
    table_->Collective(Call(view, 0, sequence, c.base), w[0].Callback());
    table_->Collective(Call(view, 2, sequence, c.odd, c.odd_algorithm),
                       w[2].Callback());
    table_->Collective(Call(view, 1, sequence, c.base), w[1].Callback());
    for (int rank = 0; rank < 3; ++rank) {
      ASSERT_EQ(w[rank].calls(), 1) << c.field;
      EXPECT_EQ(w[rank].status().code(), absl::StatusCode::kInvalidArgument)
          << c.field;
      EXPECT_EQ(
          Message(w[rank].status()),
          absl::StrCat("collective #", sequence,
                       " of group g does not match across ranks: ", c.account))
          << c.field;
    }
  }
  // The group goes on.
  ++sequence;
  auto waiters = CallAll(view, sequence, base);
  ExpectInlineResults(*waiters, view, sequence, base);
  EXPECT_EQ(Summary("g").completed, sequence);
}

// ---- Collective: device refusal --------------------------------------------

TEST_F(GroupTableTest, Collective_OneRankUnsupportedDevice_AllRanksAnswered) {
  const GroupView view = Form("g", 3);
  const CollectiveSpec spec = AllReduce(DType::kF32, 4);
  std::vector<CallWaiter> w(3);
  CollectiveCall c0 = Call(view, 0, 1, spec);
  c0.device = Cpu();
  CollectiveCall c1 = Call(view, 1, 1, spec);
  c1.device = Dev(DeviceKind::kVulkan, 0);
  table_->Collective(c0, w[0].Callback());
  table_->Collective(c1, w[1].Callback());
  table_->Collective(Call(view, 2, 1, spec), w[2].Callback());

  ASSERT_EQ(w[1].calls(), 1);
  EXPECT_EQ(w[1].status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(Message(w[1].status()), kVulkanRefusal);
  for (int rank : {0, 2}) {
    ASSERT_EQ(w[rank].calls(), 1);
    EXPECT_EQ(w[rank].status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ(Message(w[rank].status()),
              absl::StrCat("all_reduce #1 of group g cannot run: rank 1: ",
                           kVulkanRefusal));
    const std::optional<v1::ErrorDetail> detail =
        ErrorDetailOf(w[rank].status());
    ASSERT_TRUE(detail.has_value());
    EXPECT_EQ(detail->reason(), "DEVICE_REFUSED");
    EXPECT_EQ(detail->device(), "Vulkan(0)");
    EXPECT_THAT(detail->ranks(), UnorderedElementsAre(Pair(1, kVulkanRefusal)));
  }
  const std::optional<v1::ErrorDetail> own = ErrorDetailOf(w[1].status());
  ASSERT_TRUE(own.has_value());
  EXPECT_EQ(own->reason(), "DEVICE_UNSUPPORTED");
  EXPECT_EQ(own->device(), "Vulkan(0)");

  auto waiters = CallAll(view, 2, spec);
  ExpectInlineResults(*waiters, view, 2, spec);
}

TEST_F(GroupTableTest, Collective_SeveralRanksRefused_EachNamed) {
  const GroupView view = Form("g", 3);
  const CollectiveSpec spec = Spec(CollectiveKind::kAllGather, DType::kI32, 2);
  std::vector<CallWaiter> w(3);
  CollectiveCall c0 = Call(view, 0, 1, spec);
  c0.device = Dev(DeviceKind::kCuda, 0);
  CollectiveCall c2 = Call(view, 2, 1, spec);
  c2.device = Dev(DeviceKind::kMetal, 1);
  table_->Collective(c0, w[0].Callback());
  table_->Collective(Call(view, 1, 1, spec), w[1].Callback());
  table_->Collective(c2, w[2].Callback());
  const std::string cuda =
      "Distributed operations are not supported for device Cuda(0): this "
      "worker was built without CUDA";
  const std::string metal =
      "Distributed operations are not supported for device Metal(1)";
  EXPECT_EQ(w[0].status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(Message(w[0].status()), cuda);
  EXPECT_EQ(w[2].status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(Message(w[2].status()), metal);
  EXPECT_EQ(w[1].status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Message(w[1].status()),
            absl::StrCat("all_gather #1 of group g cannot run: rank 0: ", cuda,
                         "; rank 2: ", metal));
}

// ---- Collective: bad input -------------------------------------------------

struct BadCall {
  std::string label;
  CollectiveCall call;
  absl::StatusCode code;
  std::string message;
};

TEST_F(GroupTableTest, Collective_BadInput_RefusedAtOnceAndNothingChanges) {
  const GroupView view = Form("g", 2);
  const CollectiveSpec spec = AllReduce(DType::kI32, 4);
  // Rank 1's real call waits for rank 0's.
  CallWaiter real1;
  table_->Collective(Call(view, 1, 1, spec), real1.Callback());
  const CollectiveCall good = Call(view, 0, 1, spec);

  std::vector<BadCall> cases;
  auto add = [&cases, &good](std::string label, absl::StatusCode code,
                             std::string message,
                             std::function<void(CollectiveCall&)> change) {
    CollectiveCall call = good;
    change(call);
    cases.push_back(
        {std::move(label), std::move(call), code, std::move(message)});
  };
  using C = absl::StatusCode;
  add("unknown group", C::kNotFound, "unknown group \"nope\"; join it first",
      [](CollectiveCall& c) { c.group = "nope"; });
  add("epoch from the future", C::kFailedPrecondition,
      "stale epoch 2 for group g, which is at epoch 1; join again",
      [](CollectiveCall& c) { c.epoch = 2; });
  add("epoch 0", C::kFailedPrecondition,
      "stale epoch 0 for group g, which is at epoch 1; join again",
      [](CollectiveCall& c) { c.epoch = 0; });
  add("rank == world size", C::kInvalidArgument,
      "rank 2 is out of range for group g of world size 2",
      [](CollectiveCall& c) { c.rank = 2; });
  add("negative rank", C::kInvalidArgument,
      "rank -1 is out of range for group g of world size 2",
      [](CollectiveCall& c) { c.rank = -1; });
  add("sequence from the future", C::kInvalidArgument,
      "rank 0 of group g sent sequence 1025 from the future; its oldest "
      "uncalled is #1 and at most 1024 may be outstanding",
      [](CollectiveCall& c) { c.sequence = 1025; });
  add("sequence 0", C::kInvalidArgument,
      "rank 0 of group g sent sequence 0; sequences start at 1",
      [](CollectiveCall& c) { c.sequence = 0; });
  add("sequence already used by rank 1", C::kFailedPrecondition,
      "rank 1 of group g already called #1",
      [](CollectiveCall& c) { c.rank = 1; });
  add("unknown kind", C::kInvalidArgument,
      "rank 0 of group g: unknown collective kind 42",
      [](CollectiveCall& c) { c.spec.kind = static_cast<CollectiveKind>(42); });
  add("unspecified kind", C::kInvalidArgument,
      "rank 0 of group g: unknown collective kind 0",
      [](CollectiveCall& c) { c.spec.kind = CollectiveKind::kUnspecified; });
  add("unknown dtype", C::kInvalidArgument, "",
      [](CollectiveCall& c) { c.spec.dtype = static_cast<DType>(99); });
  add("unspecified dtype", C::kInvalidArgument, "",
      [](CollectiveCall& c) { c.spec.dtype = DType::kUnspecified; });
  add("unknown op", C::kInvalidArgument, "",
      [](CollectiveCall& c) { c.spec.op = static_cast<ReduceOp>(17); });
  add("count over the maximum", C::kInvalidArgument,
      "rank 0 of group g: count 1099511627777 is over the maximum of "
      "1099511627776",
      [](CollectiveCall& c) {
        c.spec.count = kMaxCount + 1;
        c.has_data = false;
        c.data.clear();
      });
  add("root out of range", C::kInvalidArgument,
      "rank 0 of group g: root 2 is out of range for world size 2",
      [](CollectiveCall& c) {
        c.spec = Spec(CollectiveKind::kBroadcast, DType::kI32, 4,
                      ReduceOp::kUnspecified, 2);
      });
  add("negative root", C::kInvalidArgument,
      "rank 0 of group g: root -1 is out of range for world size 2",
      [](CollectiveCall& c) {
        c.spec = Spec(CollectiveKind::kGather, DType::kI32, 4,
                      ReduceOp::kUnspecified, -1);
      });
  add("barrier with a count", C::kInvalidArgument,
      "rank 0 of group g: barrier carries no data, got count 3",
      [](CollectiveCall& c) {
        c.spec = Barrier();
        c.spec.count = 3;
        c.has_data = false;
        c.data.clear();
      });
  add("inline data too short", C::kInvalidArgument,
      "rank 0 passed 12 bytes for all_reduce i32[4] sum in a group of 2; "
      "expected 16",
      [](CollectiveCall& c) { c.data.resize(12); });
  add("inline data too long", C::kInvalidArgument,
      "rank 0 passed 20 bytes for all_reduce i32[4] sum in a group of 2; "
      "expected 16",
      [](CollectiveCall& c) { c.data.resize(20); });
  add("data without has_data", C::kInvalidArgument,
      "data given without has_data",
      [](CollectiveCall& c) { c.has_data = false; });
  add("unknown algorithm", C::kInvalidArgument,
      "rank 0 of group g: unknown algorithm 9",
      [](CollectiveCall& c) { c.algorithm = static_cast<Algorithm>(9); });
  add("malformed device", C::kInvalidArgument,
      "rank 0 of group g: unknown device kind 99",
      [](CollectiveCall& c) { c.device = Dev(static_cast<DeviceKind>(99)); });

  const GroupSummary before = Summary("g");
  ASSERT_EQ(before.pending_sequence, 1u);
  for (const BadCall& c : cases) {
    CallWaiter w;
    table_->Collective(c.call, w.Callback());
    ASSERT_EQ(w.calls(), 1) << c.label;
    EXPECT_EQ(w.status().code(), c.code) << c.label << ": " << w.status();
    if (!c.message.empty()) {
      EXPECT_EQ(Message(w.status()), c.message) << c.label;
    } else {
      EXPECT_THAT(Message(w.status()), StartsWith("rank 0 of group g: "))
          << c.label;
    }
    const GroupSummary after = Summary("g");
    EXPECT_EQ(after.completed, before.completed) << c.label;
    EXPECT_EQ(after.pending_sequence, before.pending_sequence) << c.label;
    EXPECT_EQ(after.missing_ranks, before.missing_ranks) << c.label;
    EXPECT_FALSE(real1.done()) << c.label;
  }
  EXPECT_EQ(table_->NextDeadline(), absl::InfiniteFuture());

  // The real calls still complete normally.
  CallWaiter real0;
  table_->Collective(good, real0.Callback());
  ASSERT_EQ(real0.calls(), 1);
  ASSERT_EQ(real1.calls(), 1);
  ASSERT_TRUE(real0.status().ok()) << real0.status();
  ASSERT_TRUE(real1.status().ok()) << real1.status();
  EXPECT_EQ(real0.value().data, Expected(spec, 2, 0, 1));
  EXPECT_EQ(real1.value().data, Expected(spec, 2, 1, 1));

  // The same call again is a retry and gets the same answer.
  CallWaiter retried;
  table_->Collective(good, retried.Callback());
  ASSERT_EQ(retried.calls(), 1);
  ASSERT_TRUE(retried.status().ok()) << retried.status();
  EXPECT_EQ(retried.value().data, real0.value().data);

  // A different call on sequence 1 is refused: it is used now.
  CollectiveCall other = good;
  other.data.assign(other.data.size(), '\x7f');
  CallWaiter again;
  table_->Collective(other, again.Callback());
  ASSERT_EQ(again.calls(), 1);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Message(again.status()), "rank 0 of group g already called #1");

  auto waiters = CallAll(view, 2, spec);
  ExpectInlineResults(*waiters, view, 2, spec);
  EXPECT_EQ(Summary("g").completed, 2u);
}

TEST_F(GroupTableTest, Collective_InlineButNoData_EveryRankInvalidArgument) {
  const GroupView view = Form("g", 3);
  const CollectiveSpec spec = AllReduce(DType::kI32, 4);
  std::vector<CallWaiter> w(3);
  for (int rank = 0; rank < 3; ++rank) {
    CollectiveCall call = Call(view, rank, 1, spec);
    if (rank == 1) {
      call.has_data = false;
      call.data.clear();
    }
    table_->Collective(call, w[rank].Callback());
  }
  for (const CallWaiter& waiter : w) {
    ASSERT_EQ(waiter.calls(), 1);
    EXPECT_EQ(waiter.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(Message(waiter.status()),
              "all_reduce #1 of group g runs inline, but rank 1 sent no data");
  }
}

// ---- Collective: plans -----------------------------------------------------

TEST_F(GroupTableTest, Collective_BySize_PlannerChoosesAndNoDataReturned) {
  const GroupView view = Form("g", 2);
  struct Case {
    CollectiveSpec spec;
    Algorithm algorithm;
  };
  const Case cases[] = {
      {AllReduce(DType::kF32, 65536), Algorithm::kRecursiveDoubling},
      {AllReduce(DType::kF32, 1 << 20), Algorithm::kRing},
      {Spec(CollectiveKind::kAllGather, DType::kF32, 65536), Algorithm::kRing},
  };
  uint64_t sequence = 0;
  for (const Case& c : cases) {
    ++sequence;
    auto w = CallAll(view, sequence, c.spec);
    for (const CallWaiter& waiter : *w) {
      ASSERT_TRUE(waiter.status().ok()) << waiter.status();
      EXPECT_EQ(waiter.value().plan.algorithm, c.algorithm)
          << DescribeSpec(c.spec);
      // At least four chunks per step, each at least 64 KiB, at most 1 MiB.
      EXPECT_GE(waiter.value().plan.chunk_bytes, 64u << 10);
      EXPECT_LE(waiter.value().plan.chunk_bytes, 1u << 20);
      EXPECT_TRUE(waiter.value().data.empty());
    }
  }
}

TEST_F(GroupTableTest, Collective_ForcedAlgorithms_AgreedByAllRanks) {
  const GroupView view = Form("g", 3);
  auto ring = CallAll(view, 1, AllReduce(DType::kF32, 4), Algorithm::kRing);
  for (const CallWaiter& w : *ring) {
    ASSERT_TRUE(w.status().ok()) << w.status();
    EXPECT_EQ(w.value().plan.algorithm, Algorithm::kRing);
  }

  // 128 KiB forced inline: the data rides and the result comes back.
  const CollectiveSpec big = AllReduce(DType::kF32, 32768);
  auto in = CallAll(view, 2, big, Algorithm::kInline);
  ExpectInlineResults(*in, view, 2, big);

  // A forced algorithm the kind cannot use is bad input: refused at once,
  // without taking the sequence number.
  auto rd = CallAll(view, 3, Spec(CollectiveKind::kAllGather, DType::kF32, 4),
                    Algorithm::kRecursiveDoubling);
  for (int rank = 0; rank < 3; ++rank) {
    const CallWaiter& w = (*rd)[rank];
    EXPECT_EQ(w.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(Message(w.status()),
              absl::StrCat("rank ", rank,
                           " of group g: recursive_doubling is available for "
                           "all_reduce only, not all_gather"));
  }
  auto tree = CallAll(view, 3, AllReduce(DType::kF32, 4), Algorithm::kTree);
  for (const CallWaiter& w : *tree) {
    EXPECT_EQ(w.status().code(), absl::StatusCode::kInvalidArgument);
  }

  auto after = CallAll(view, 3, AllReduce(DType::kF32, 4));
  ExpectInlineResults(*after, view, 3, AllReduce(DType::kF32, 4));
  EXPECT_EQ(Summary("g").completed, 3u);
}

TEST_F(GroupTableTest, Collective_Barrier_InlineWithoutData) {
  const GroupView view = Form("g", 3);
  std::vector<CallWaiter> w(3);
  table_->Collective(Call(view, 0, 1, Barrier()), w[0].Callback());
  table_->Collective(Call(view, 1, 1, Barrier()), w[1].Callback());
  EXPECT_FALSE(w[0].done());
  table_->Collective(Call(view, 2, 1, Barrier()), w[2].Callback());
  for (const CallWaiter& waiter : w) {
    ASSERT_TRUE(waiter.status().ok()) << waiter.status();
    EXPECT_EQ(waiter.value().plan.algorithm, Algorithm::kInline);
    EXPECT_TRUE(waiter.value().data.empty());
  }
}

TEST_F(GroupTableTest, Collective_WorldSizeOne_AnsweredAtOnce) {
  const GroupView view = Form("solo", 1);
  const CollectiveSpec spec = AllReduce(DType::kI32, 3);
  auto w = CallAll(view, 1, spec);
  ExpectInlineResults(*w, view, 1, spec);
}

// ---- Collective: deadlines -------------------------------------------------

TEST_F(GroupTableTest,
       Collective_RanksMissing_DeadlineExceededThenGroupGoesOn) {
  const GroupView view = Form("g", 4);
  const CollectiveSpec spec = AllReduce(DType::kI32, 2);
  const absl::Time start = clock_.Now();
  CallWaiter w0, w1;
  table_->Collective(
      Call(view, 0, 1, spec, Algorithm::kUnspecified, absl::Seconds(10)),
      w0.Callback());
  clock_.Advance(absl::Seconds(1));
  table_->Collective(
      Call(view, 1, 1, spec, Algorithm::kUnspecified, absl::Seconds(5)),
      w1.Callback());
  EXPECT_EQ(table_->NextDeadline(), start + absl::Seconds(6));
  GroupSummary summary = Summary("g");
  EXPECT_EQ(summary.pending_sequence, 1u);
  EXPECT_THAT(summary.missing_ranks, ElementsAre(2, 3));
  EXPECT_EQ(summary.pending_since, start);

  clock_.Advance(absl::Seconds(5) - absl::Milliseconds(1));
  table_->ExpireDeadlines();
  EXPECT_FALSE(w0.done());
  EXPECT_FALSE(w1.done());

  clock_.Advance(absl::Milliseconds(1));
  table_->ExpireDeadlines();
  const std::string verdict =
      "ranks 2, 3 of group g did not reach all_reduce #1 within the deadline";
  for (CallWaiter* w : {&w0, &w1}) {
    ASSERT_EQ(w->calls(), 1);
    EXPECT_EQ(w->status().code(), absl::StatusCode::kDeadlineExceeded);
    EXPECT_EQ(Message(w->status()), verdict);
    const std::optional<v1::ErrorDetail> detail = ErrorDetailOf(w->status());
    ASSERT_TRUE(detail.has_value());
    EXPECT_EQ(detail->reason(), "RANKS_MISSING");
    EXPECT_EQ(detail->sequence(), 1u);
    EXPECT_THAT(detail->missing_ranks(), ElementsAre(2, 3));
  }
  EXPECT_EQ(table_->NextDeadline(), absl::InfiniteFuture());
  summary = Summary("g");
  EXPECT_EQ(summary.pending_sequence, 0u);
  EXPECT_EQ(summary.completed, 1u);
  table_->ExpireDeadlines();
  EXPECT_EQ(w0.calls(), 1);

  // A late rank gets the same verdict at once, whatever it asks for.
  CallWaiter late2;
  table_->Collective(Call(view, 2, 1, spec), late2.Callback());
  ASSERT_EQ(late2.calls(), 1);
  EXPECT_EQ(late2.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(Message(late2.status()), verdict);

  // The others go on to #2 before the last one catches up.
  std::vector<CallWaiter> second(4);
  for (int rank : {0, 1, 2}) {
    table_->Collective(Call(view, rank, 2, spec), second[rank].Callback());
  }
  CallWaiter late3;
  table_->Collective(Call(view, 3, 1, Barrier()), late3.Callback());
  ASSERT_EQ(late3.calls(), 1);
  EXPECT_EQ(late3.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(Message(late3.status()), verdict);
  EXPECT_FALSE(second[0].done());

  table_->Collective(Call(view, 3, 2, spec), second[3].Callback());
  ExpectInlineResults(second, view, 2, spec);
  summary = Summary("g");
  EXPECT_EQ(summary.completed, 2u);
  EXPECT_EQ(summary.pending_sequence, 0u);

  // Sequence 1 stays used.
  CallWaiter reuse;
  table_->Collective(Call(view, 2, 1, spec), reuse.Callback());
  EXPECT_EQ(reuse.status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(GroupTableTest, Collective_OneRankMissing_SingularWording) {
  const GroupView view = Form("g", 3);
  std::vector<CallWaiter> w(3);
  for (int rank : {0, 2}) {
    table_->Collective(Call(view, rank, 1, Barrier(), Algorithm::kUnspecified,
                            absl::Seconds(1)),
                       w[rank].Callback());
  }
  clock_.Advance(absl::Seconds(2));
  table_->ExpireDeadlines();
  EXPECT_EQ(Message(w[0].status()),
            "rank 1 of group g did not reach barrier #1 within the deadline");
  EXPECT_EQ(Message(w[2].status()), Message(w[0].status()));
}

TEST_F(GroupTableTest, Collective_TwoGroupsInterleaved_Independent) {
  const GroupView a = Form("a", 2);
  const GroupView b = Form("b", 3);
  const CollectiveSpec sa = AllReduce(DType::kI32, 3);
  const CollectiveSpec sb = Spec(CollectiveKind::kAllGather, DType::kF32, 2);
  std::vector<CallWaiter> a1(2), a2(2), b1(3);
  table_->Collective(Call(a, 0, 1, sa), a1[0].Callback());
  table_->Collective(Call(b, 0, 1, sb), b1[0].Callback());
  table_->Collective(Call(b, 1, 1, sb), b1[1].Callback());
  table_->Collective(Call(a, 0, 2, sa), a2[0].Callback());
  table_->Collective(Call(a, 1, 1, sa), a1[1].Callback());
  ExpectInlineResults(a1, a, 1, sa);
  EXPECT_FALSE(b1[0].done());
  table_->Collective(Call(b, 2, 1, sb), b1[2].Callback());
  ExpectInlineResults(b1, b, 1, sb);
  EXPECT_FALSE(a2[0].done());
  table_->Collective(Call(a, 1, 2, sa), a2[1].Callback());
  ExpectInlineResults(a2, a, 2, sa);

  // A deadline in b leaves a's pending call alone.
  CallWaiter b2, a3;
  table_->Collective(
      Call(b, 0, 2, sb, Algorithm::kUnspecified, absl::Seconds(1)),
      b2.Callback());
  table_->Collective(Call(a, 0, 3, sa), a3.Callback());
  clock_.Advance(absl::Seconds(1));
  table_->ExpireDeadlines();
  ASSERT_EQ(b2.calls(), 1);
  EXPECT_EQ(Message(b2.status()),
            "ranks 1, 2 of group b did not reach all_gather #2 within the "
            "deadline");
  EXPECT_FALSE(a3.done());
  CallWaiter a3_1;
  table_->Collective(Call(a, 1, 3, sa), a3_1.Callback());
  EXPECT_TRUE(a3.status().ok()) << a3.status();
  EXPECT_TRUE(a3_1.status().ok()) << a3_1.status();

  EXPECT_EQ(Summary("a").completed, 3u);
  EXPECT_EQ(Summary("b").completed, 2u);
  const std::vector<GroupSummary> groups = table_->List();
  ASSERT_THAT(groups, SizeIs(2));
  EXPECT_EQ(groups[0].view.name, "a");
  EXPECT_EQ(groups[1].view.name, "b");
}

// ---- AbortAll, re-entrancy, leaks ------------------------------------------

TEST_F(GroupTableTest, AbortAll_PendingJoinsAndCalls_EveryWaiterAnswered) {
  const GroupView g = Form("g", 2);
  CallWaiter call;
  table_->Collective(Call(g, 0, 1, AllReduce(DType::kI32, 1),
                          Algorithm::kUnspecified, absl::Seconds(3)),
                     call.Callback());
  JoinWaiter join;
  table_->Join(Req("f", 2, 0, absl::Seconds(3)), join.Callback());
  ASSERT_NE(table_->NextDeadline(), absl::InfiniteFuture());

  table_->AbortAll(absl::UnavailableError("the coordinator is shutting down"));
  for (const absl::Status& status : {call.status(), join.status()}) {
    EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
    EXPECT_EQ(Message(status), "the coordinator is shutting down");
  }
  EXPECT_EQ(call.calls(), 1);
  EXPECT_EQ(join.calls(), 1);
  EXPECT_THAT(table_->List(), IsEmpty());
  EXPECT_EQ(table_->NextDeadline(), absl::InfiniteFuture());

  clock_.Advance(absl::Seconds(10));
  table_->ExpireDeadlines();
  EXPECT_EQ(call.calls(), 1);
  EXPECT_EQ(join.calls(), 1);

  CallWaiter after;
  table_->Collective(Call(g, 1, 1, AllReduce(DType::kI32, 1)),
                     after.Callback());
  EXPECT_EQ(after.status().code(), absl::StatusCode::kNotFound);

  // Epochs keep counting across the abort; "f" forms from scratch.
  EXPECT_EQ(Form("g", 2).epoch, 2u);
  EXPECT_EQ(Form("f", 3).epoch, 1u);
}

TEST_F(GroupTableTest, Collective_CallbackCallsBackIn_NoDeadlock) {
  const GroupView view = Form("g", 2);
  const CollectiveSpec spec = AllReduce(DType::kI32, 2);
  constexpr int kCalls = 5;
  std::vector<absl::StatusOr<CollectiveOutcome>> rank0;
  // Rank 0 issues its next call from inside the previous one's callback.
  std::function<void(absl::StatusOr<CollectiveOutcome>)> chain =
      [&](absl::StatusOr<CollectiveOutcome> outcome) {
        rank0.push_back(outcome);
        EXPECT_THAT(table_->List(), SizeIs(1));
        if (rank0.size() < static_cast<size_t>(kCalls)) {
          table_->Collective(Call(view, 0, rank0.size() + 1, spec), chain);
        }
      };
  table_->Collective(Call(view, 0, 1, spec), chain);
  std::vector<CallWaiter> rank1(kCalls);
  for (int i = 0; i < kCalls; ++i) {
    table_->Collective(Call(view, 1, i + 1, spec), rank1[i].Callback());
    ASSERT_TRUE(rank1[i].status().ok()) << rank1[i].status();
  }
  ASSERT_THAT(rank0, SizeIs(kCalls));
  for (int i = 0; i < kCalls; ++i) {
    ASSERT_TRUE(rank0[i].ok()) << rank0[i].status();
    EXPECT_EQ(rank0[i]->data, Expected(spec, 2, 0, i + 1));
  }
}

TEST_F(GroupTableTest, Collective_ConcurrentRanks_AllComplete) {
  constexpr int kWorld = 4;
  constexpr int kCalls = 200;
  const GroupView view = Form("g", kWorld);
  const CollectiveSpec spec = AllReduce(DType::kI32, 4);
  std::vector<CollectiveCall> calls;
  for (int rank = 0; rank < kWorld; ++rank) {
    for (int i = 1; i <= kCalls; ++i)
      calls.push_back(Call(view, rank, i, spec));
  }
  std::vector<CallWaiter> w(kWorld * kCalls);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < kWorld; ++rank) {
    threads.emplace_back([&, rank] {
      for (int i = 0; i < kCalls; ++i) {
        table_->Collective(calls[rank * kCalls + i],
                           w[rank * kCalls + i].Callback());
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int rank = 0; rank < kWorld; ++rank) {
    for (int i = 0; i < kCalls; ++i) {
      const CallWaiter& waiter = w[rank * kCalls + i];
      ASSERT_EQ(waiter.calls(), 1);
      ASSERT_TRUE(waiter.status().ok()) << waiter.status();
      EXPECT_EQ(waiter.value().data, Expected(spec, kWorld, rank, i + 1));
    }
  }
  EXPECT_EQ(Summary("g").completed, static_cast<uint64_t>(kCalls));
  EXPECT_EQ(Summary("g").pending_sequence, 0u);
}

TEST_F(GroupTableTest, Collective_ThousandSmallAllReduces_NoPendingStateLeft) {
  constexpr int kWorld = 4;
  constexpr uint64_t kCalls = 1000;
  const GroupView view = Form("g", kWorld);
  const CollectiveSpec spec = AllReduce(DType::kF32, 8);
  for (uint64_t sequence = 1; sequence <= kCalls; ++sequence) {
    std::vector<CallWaiter> w(kWorld);
    for (int i = 0; i < kWorld; ++i) {
      const int rank = static_cast<int>((sequence + i) % kWorld);
      table_->Collective(Call(view, rank, sequence, spec,
                              Algorithm::kUnspecified, absl::Seconds(1)),
                         w[rank].Callback());
    }
    for (int rank = 0; rank < kWorld; ++rank) {
      ASSERT_EQ(w[rank].calls(), 1) << sequence;
      ASSERT_TRUE(w[rank].status().ok()) << w[rank].status();
      ASSERT_EQ(w[rank].value().sequence, sequence);
    }
    if (sequence == kCalls) ExpectInlineResults(w, view, sequence, spec);
  }
  const std::vector<GroupSummary> groups = table_->List();
  ASSERT_THAT(groups, SizeIs(1));
  EXPECT_EQ(groups[0].completed, kCalls);
  EXPECT_EQ(groups[0].pending_sequence, 0u);
  EXPECT_THAT(groups[0].missing_ranks, IsEmpty());
  EXPECT_EQ(table_->NextDeadline(), absl::InfiniteFuture());
  clock_.Advance(absl::Seconds(2));
  table_->ExpireDeadlines();
  EXPECT_EQ(table_->List()[0].completed, kCalls);
}

}  // namespace
}  // namespace chorus

namespace chorus {
namespace {

TEST_F(GroupTableTest, Collective_SequencesOutOfOrder_EachMatchedWithItsOwn) {
  const GroupView view = Form("g", 2);
  const CollectiveSpec spec = AllReduce(DType::kI32, 4);
  // Rank 0 issues #1 and #2 together and #2 reaches the coordinator first.
  std::vector<CallWaiter> first(2), second(2);
  table_->Collective(Call(view, 0, 2, spec), second[0].Callback());
  table_->Collective(Call(view, 0, 1, spec), first[0].Callback());
  table_->Collective(Call(view, 1, 1, spec), first[1].Callback());
  table_->Collective(Call(view, 1, 2, spec), second[1].Callback());
  ExpectInlineResults(first, view, 1, spec);
  ExpectInlineResults(second, view, 2, spec);
  auto third = CallAll(view, 3, spec);
  ExpectInlineResults(*third, view, 3, spec);
}

// Two workers on one host, each with the CPU and Cuda(0).
TEST_F(GroupTableTest, Collective_RankOnGpuInSameHostGroup_PlansDataPlane) {
  std::vector<uint64_t> ids;
  for (int i = 0; i < 2; ++i) {
    WorkerRegistration r;
    r.name = absl::StrCat("gpu", i);
    r.host = "one-host";
    r.address = absl::StrCat("10.0.1.", i, ":7100");
    r.cuda_support = true;
    r.devices = {Cpu(), Dev(DeviceKind::kCuda, 0)};
    ids.push_back(registry_.Register(r)->worker_id);
  }
  std::vector<JoinWaiter> joins(2);
  for (int rank = 0; rank < 2; ++rank) {
    JoinRequest request = Req("pair", 2, rank);
    request.worker_id = ids[rank];
    table_->Join(request, joins[rank].Callback());
  }
  ASSERT_TRUE(joins[0].status().ok()) << joins[0].status();
  const GroupView view = joins[0].value();
  ASSERT_TRUE(view.same_host);
  const CollectiveSpec spec = AllReduce(DType::kF32, 1 << 20);

  // Both on the CPU: shared memory.
  auto cpu = CallAll(view, 1, spec);
  ASSERT_TRUE((*cpu)[0].status().ok()) << (*cpu)[0].status();
  EXPECT_EQ((*cpu)[0].value().plan.algorithm, Algorithm::kSameHost);

  // Rank 1's buffers on Cuda(0): the data plane, so it reduces on the GPU.
  std::vector<CallWaiter> gpu(2);
  for (int rank = 0; rank < 2; ++rank) {
    CollectiveCall call = Call(view, rank, 2, spec);
    if (rank == 1) call.device = Dev(DeviceKind::kCuda, 0);
    table_->Collective(call, gpu[rank].Callback());
  }
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_TRUE(gpu[rank].status().ok()) << gpu[rank].status();
    EXPECT_EQ(gpu[rank].value().plan.algorithm, Algorithm::kRing) << rank;
  }
}

// Workers sharing a host name, on one machine or not: the machine and
// network namespace they registered decide.
TEST_F(GroupTableTest, Join_SameHostNameOtherMachines_NotSameHost) {
  struct Case {
    std::vector<std::string> machines;
    bool same_host;
  };
  const std::vector<Case> cases = {
      {{"m1/net:[1]", "m1/net:[1]"}, true},
      {{"m1/net:[1]", "m1/net:[2]"}, false},  // containers, one machine
      {{"m1/net:[1]", "m2/net:[1]"}, false},  // cloned machines
      {{"m1/net:[1]", ""}, false},
      {{"", ""}, true},  // only the host name is known
  };
  int group = 0;
  for (const Case& c : cases) {
    std::vector<uint64_t> ids;
    for (int i = 0; i < 2; ++i) {
      WorkerRegistration r;
      r.name = absl::StrCat("clone", group, "-", i);
      r.host = "vm";
      r.machine = c.machines[i];
      r.address = absl::StrCat("10.0.2.", i, ":", 7100 + group);
      r.devices = {Cpu()};
      ids.push_back(registry_.Register(r)->worker_id);
    }
    std::vector<JoinWaiter> joins(2);
    const std::string name = absl::StrCat("clones-", group++);
    for (int rank = 0; rank < 2; ++rank) {
      JoinRequest request = Req(name, 2, rank);
      request.worker_id = ids[rank];
      table_->Join(request, joins[rank].Callback());
    }
    ASSERT_TRUE(joins[0].status().ok()) << joins[0].status();
    EXPECT_EQ(joins[0].value().same_host, c.same_host)
        << c.machines[0] << " and " << c.machines[1];
  }
}

}  // namespace
}  // namespace chorus
