// A coordinator that takes over from the leader before it (state_log.h):
// what the registry and group tables write, and how restored groups answer
// the ranks whose answers the old leader never sent.
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/coordinator/group_table.h"
#include "server/coordinator/registry.h"
#include "server/coordinator/state_log.h"
#include "tests/testing/fake_clock.h"

namespace chorus {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

constexpr int kWorld = 3;

// A log in memory: what a leader wrote, as a new leader reads it.
class MemoryLog final : public StateLog {
 public:
  void SaveWorker(const WorkerRecord& record) override {
    ++writes;
    workers[record.id] = record;
  }
  void DropWorker(uint64_t id) override {
    ++writes;
    workers.erase(id);
  }
  void SaveGroup(const StoredGroup& group) override {
    ++writes;
    groups[group.view.name] = group;
  }
  void DropGroup(const std::string&, const std::string& name) override {
    ++writes;
    groups.erase(name);
  }
  void SaveKey(const StoredKey& key) override {
    ++writes;
    keys[key.key] = key;
  }
  void DropKey(const std::string&, const std::string& key) override {
    ++writes;
    keys.erase(key);
  }
  StoredState State() const {
    StoredState state;
    for (const auto& [id, record] : workers) state.workers.push_back(record);
    for (const auto& [name, group] : groups) state.groups.push_back(group);
    return state;
  }

  int writes = 0;
  std::map<uint64_t, WorkerRecord> workers;
  std::map<std::string, StoredGroup> groups;
  std::map<std::string, StoredKey> keys;
};

Device Cpu() {
  Device d;
  d.kind = DeviceKind::kCpu;
  return d;
}

std::string I64(int64_t value) {
  return std::string(reinterpret_cast<const char*>(&value), sizeof(value));
}

int64_t ValueOf(const std::string& bytes) {
  int64_t value = -1;
  if (bytes.size() == sizeof(value)) memcpy(&value, bytes.data(), 8);
  return value;
}

// What a callback got.
struct Answer {
  int calls = 0;
  std::optional<absl::StatusOr<CollectiveOutcome>> outcome;
  std::function<void(absl::StatusOr<CollectiveOutcome>)> Callback() {
    return [this](absl::StatusOr<CollectiveOutcome> got) {
      ++calls;
      outcome = std::move(got);
    };
  }
  absl::Status status() const {
    return outcome ? outcome->status() : absl::UnknownError("no answer");
  }
  int64_t sum() const { return ValueOf((*outcome)->data); }
};

class GroupRestoreTest : public ::testing::Test {
 protected:
  GroupRestoreTest() : registry_(&clock_, absl::Hours(1), &log_) {
    for (int i = 0; i < kWorld; ++i) {
      WorkerRegistration r;
      r.name = absl::StrCat("w", i);
      r.address = absl::StrCat("10.0.0.", i, ":7100");
      r.incarnation = 7;
      r.devices = {Cpu()};
      workers_.push_back(registry_.Register(r)->worker_id);
    }
    table_ = NewTable(&registry_);
  }

  std::unique_ptr<GroupTable> NewTable(Registry* registry) {
    GroupTableOptions options;
    options.log = &log_;
    return std::make_unique<GroupTable>(&clock_, registry, options);
  }

  GroupView Form(GroupTable& table) {
    std::vector<std::optional<absl::StatusOr<GroupView>>> views(kWorld);
    for (int rank = 0; rank < kWorld; ++rank) {
      JoinRequest request;
      request.group = "g";
      request.world_size = kWorld;
      request.rank = rank;
      request.worker_id = workers_[rank];
      request.device = Cpu();
      request.request_id = absl::StrCat("join-", rank);
      table.Join(request, [&views, rank](const absl::StatusOr<GroupView>& v) {
        views[rank] = v;
      });
    }
    EXPECT_TRUE(views[0].has_value() && views[0]->ok());
    return **views[0];
  }

  // Rank `rank`'s all_reduce (sum) of one i64, (rank + 1) * sequence.
  static CollectiveCall Call(const GroupView& view, int rank,
                             uint64_t sequence) {
    CollectiveCall call;
    call.group = view.name;
    call.epoch = view.epoch;
    call.rank = rank;
    call.sequence = sequence;
    call.spec.kind = CollectiveKind::kAllReduce;
    call.spec.dtype = DType::kI64;
    call.spec.count = 1;
    call.spec.op = ReduceOp::kSum;
    call.has_data = true;
    call.data = I64((rank + 1) * static_cast<int64_t>(sequence));
    return call;
  }

  // Call(), planned for the data plane (a ring), without inline data.
  static CollectiveCall RingCall(const GroupView& view, int rank,
                                 uint64_t sequence) {
    CollectiveCall call = Call(view, rank, sequence);
    call.algorithm = Algorithm::kRing;
    call.has_data = false;
    call.data.clear();
    return call;
  }

  // Rank `rank`'s commit of #`sequence` with an agreeing result hash;
  // sets *verdict to its verdict.
  static void CommitOn(GroupTable& table, const GroupView& view, int rank,
                       uint64_t sequence, absl::Status* verdict) {
    CommitCall commit;
    commit.group = view.name;
    commit.epoch = view.epoch;
    commit.rank = rank;
    commit.sequence = sequence;
    commit.result_hash = 1;
    table.Commit(commit, [verdict](absl::Status s) { *verdict = s; });
  }

  // A new leader: a registry and table restored from what was written.
  void TakeOver() {
    const StoredState state = log_.State();
    next_registry_ = std::make_unique<Registry>(&clock_, absl::Hours(1), &log_);
    next_registry_->Restore(state.workers);
    next_table_ = NewTable(next_registry_.get());
    next_table_->Restore(state.groups);
  }

  // Every rank's call #2 on the new leader is matched (1*2 + 2*2 + 3*2).
  void ExpectSecondCallMatched(const GroupView& view) {
    std::vector<Answer> next(kWorld);
    for (int rank = 0; rank < kWorld; ++rank) {
      next_table_->Collective(Call(view, rank, 2), next[rank].Callback());
    }
    EXPECT_EQ(next[0].sum(), 12);
  }

  // The old leader planned #1 (a ring) and died: rank 0 had finished its
  // part and was committing, so it sends its call as a running call before
  // its commit (a worker keeps a call running until its commit's verdict);
  // rank 1 still runs the plan; rank 2 never heard it and calls again,
  // before rank 0's call and commit or after them. Rank 2 must get the
  // same plan, and every commit the verdict.
  void PlanLostWhileOneCommits(bool late_call_first) {
    const GroupView view = Form(*table_);
    std::vector<Answer> planned(kWorld);
    for (int rank = 0; rank < kWorld; ++rank) {
      table_->Collective(RingCall(view, rank, 1), planned[rank].Callback());
    }
    TakeOver();
    std::vector<absl::Status> verdicts(kWorld, absl::UnknownError("none"));
    Answer running;
    Answer left_behind;
    if (late_call_first) {
      next_table_->Collective(RingCall(view, 2, 1), left_behind.Callback());
    }
    CollectiveCall call = RingCall(view, 0, 1);
    call.running = true;
    next_table_->Collective(call, running.Callback());
    CommitOn(*next_table_, view, 0, 1, &verdicts[0]);
    EXPECT_EQ(verdicts[0].code(), absl::StatusCode::kUnknown)
        << "the commit waits: " << verdicts[0];
    call = RingCall(view, 1, 1);
    call.running = true;
    next_table_->Collective(call, running.Callback());
    if (!late_call_first) {
      next_table_->Collective(RingCall(view, 2, 1), left_behind.Callback());
    }
    ASSERT_TRUE(left_behind.status().ok()) << left_behind.status();
    EXPECT_EQ((*left_behind.outcome)->plan.algorithm, Algorithm::kRing);
    EXPECT_EQ((*left_behind.outcome)->plan.chunk_bytes,
              (*planned[2].outcome)->plan.chunk_bytes);
    for (int rank : {1, 2}) {
      CommitOn(*next_table_, view, rank, 1, &verdicts[rank]);
    }
    for (const absl::Status& verdict : verdicts) {
      EXPECT_TRUE(verdict.ok()) << verdict;
    }
    ExpectSecondCallMatched(view);
  }

  FakeClock clock_;
  MemoryLog log_;
  Registry registry_;
  std::vector<uint64_t> workers_;
  std::unique_ptr<GroupTable> table_;
  std::unique_ptr<Registry> next_registry_;
  std::unique_ptr<GroupTable> next_table_;
};

TEST_F(GroupRestoreTest, Log_MembershipChanges_WrittenNeverPerCollective) {
  EXPECT_EQ(log_.workers.size(), 3u);
  const GroupView view = Form(*table_);
  ASSERT_EQ(log_.groups.count("g"), 1u);
  EXPECT_EQ(log_.groups["g"].view.epoch, view.epoch);
  EXPECT_TRUE(log_.groups["g"].aborted.ok());
  const int before = log_.writes;
  for (uint64_t sequence = 1; sequence <= 100; ++sequence) {
    std::vector<Answer> answers(kWorld);
    for (int rank = 0; rank < kWorld; ++rank) {
      table_->Collective(Call(view, rank, sequence), answers[rank].Callback());
    }
    ASSERT_TRUE(answers[2].status().ok()) << answers[2].status();
  }
  EXPECT_EQ(log_.writes, before);
  table_->ReportFailure("g", view.epoch, 1, 0, absl::UnavailableError("gone"));
  EXPECT_EQ(log_.writes, before + 1);
  EXPECT_EQ(log_.groups["g"].aborted.code(), absl::StatusCode::kAborted);
}

TEST_F(GroupRestoreTest, Registry_Restore_KeepsIdsAndGivesNewOnesAbove) {
  ASSERT_TRUE(registry_.Deregister(workers_[1], 7).ok());
  EXPECT_EQ(log_.workers.size(), 2u);
  TakeOver();
  std::vector<uint64_t> ids;
  for (const WorkerRecord& record : next_registry_->List()) {
    ids.push_back(record.id);
  }
  EXPECT_THAT(ids, ElementsAre(workers_[0], workers_[2]));
  // The worker registers again with the new leader: the same id, kept.
  WorkerRegistration again = next_registry_->List()[0].registration;
  absl::StatusOr<RegisterResult> kept = next_registry_->Register(again);
  ASSERT_TRUE(kept.ok());
  EXPECT_TRUE(kept->retried);
  EXPECT_EQ(kept->worker_id, workers_[0]);
  WorkerRegistration fresh = again;
  fresh.name = "w9";
  EXPECT_GT(next_registry_->Register(fresh)->worker_id, workers_[2]);
}

TEST_F(GroupRestoreTest, Restore_RanksMovedOn_ReplaysAnswerTheRankLeftBehind) {
  const GroupView view = Form(*table_);
  // The old leader decides #1 and answers ranks 0 and 1; rank 2's answer
  // is lost when it dies.
  std::vector<Answer> old(kWorld);
  for (int rank = 0; rank < kWorld; ++rank) {
    table_->Collective(Call(view, rank, 1), old[rank].Callback());
  }
  ASSERT_EQ(old[0].sum(), 6);
  TakeOver();
  // Ranks 0 and 1 go on with #2, carrying #1 as a replay.
  std::vector<Answer> second(kWorld);
  for (int rank = 0; rank < 2; ++rank) {
    CollectiveCall call = Call(view, rank, 2);
    call.replays.push_back(Call(view, rank, 1));
    next_table_->Collective(call, second[rank].Callback());
    EXPECT_EQ(second[rank].calls, 0);
  }
  // Rank 2 sends #1 again: the same verdict the others got.
  Answer retried;
  next_table_->Collective(Call(view, 2, 1), retried.Callback());
  ASSERT_TRUE(retried.status().ok()) << retried.status();
  EXPECT_EQ(retried.sum(), old[0].sum());
  next_table_->Collective(Call(view, 2, 2), second[2].Callback());
  for (int rank = 0; rank < kWorld; ++rank) {
    ASSERT_TRUE(second[rank].status().ok()) << second[rank].status();
    EXPECT_EQ(second[rank].sum(), 12);
  }
}

TEST_F(GroupRestoreTest, Restore_ReplayOfAnotherSequence_ChangesNothing) {
  const GroupView view = Form(*table_);
  TakeOver();
  // A replay is only of an earlier call of the same rank: one "from the
  // future" or of a sequence 0 is dropped, and the call matches as sent.
  std::vector<Answer> answers(kWorld);
  for (int rank = 0; rank < kWorld; ++rank) {
    CollectiveCall call = Call(view, rank, 4);
    call.replays.push_back(Call(view, rank, 9));
    call.replays.push_back(Call(view, rank, 0));
    next_table_->Collective(call, answers[rank].Callback());
  }
  for (int rank = 0; rank < kWorld; ++rank) {
    ASSERT_TRUE(answers[rank].status().ok()) << answers[rank].status();
    EXPECT_EQ(answers[rank].sum(), 24);
  }
}

TEST_F(GroupRestoreTest, Restore_AbortedGroup_CallsGetTheSameAbort) {
  const GroupView view = Form(*table_);
  const absl::Status aborted = table_->ReportFailure(
      "g", view.epoch, 1, 0, absl::UnavailableError("client gone"));
  TakeOver();
  Answer answer;
  next_table_->Collective(Call(view, 0, 1), answer.Callback());
  EXPECT_EQ(answer.status(), aborted);
}

TEST_F(GroupRestoreTest, Commit_PlannedByOldLeader_CommitsOnTheNewOne) {
  const GroupView view = Form(*table_);
  std::vector<Answer> planned(kWorld);
  for (int rank = 0; rank < kWorld; ++rank) {
    CollectiveCall call = Call(view, rank, 1);
    call.algorithm = Algorithm::kRing;
    call.has_data = false;
    call.data.clear();
    table_->Collective(call, planned[rank].Callback());
  }
  ASSERT_TRUE(planned[0].status().ok()) << planned[0].status();
  ASSERT_EQ((*planned[0].outcome)->plan.algorithm, Algorithm::kRing);
  TakeOver();
  std::vector<absl::Status> verdicts(kWorld, absl::UnknownError("none"));
  for (int rank = 0; rank < kWorld; ++rank) {
    CommitCall commit;
    commit.group = "g";
    commit.epoch = view.epoch;
    commit.rank = rank;
    commit.sequence = 1;
    commit.result_hash = rank == 2 ? 2 : 1;
    next_table_->Commit(
        commit, [&verdicts, rank](absl::Status s) { verdicts[rank] = s; });
  }
  // The commits matched; rank 2's result differs, as the old leader would
  // have said.
  for (const absl::Status& verdict : verdicts) {
    EXPECT_EQ(verdict.code(), absl::StatusCode::kDataLoss) << verdict;
  }
  // The ranks' next call goes on at #2.
  ExpectSecondCallMatched(view);
  EXPECT_THAT(next_table_->Forming(), IsEmpty());
}

TEST_F(GroupRestoreTest,
       Collective_PlanLostForOneRank_RunningCallsPlanItAgain) {
  const GroupView view = Form(*table_);
  // The old leader planned #1, and died before rank 2 heard it.
  std::vector<Answer> planned(kWorld);
  for (int rank = 0; rank < kWorld; ++rank) {
    table_->Collective(RingCall(view, rank, 1), planned[rank].Callback());
  }
  ASSERT_EQ((*planned[0].outcome)->plan.algorithm, Algorithm::kRing);
  TakeOver();
  // Rank 2 calls again; ranks 0 and 1, running the plan, send running
  // calls, answered at once.
  Answer left_behind;
  next_table_->Collective(RingCall(view, 2, 1), left_behind.Callback());
  std::vector<Answer> running(2);
  for (int rank = 0; rank < 2; ++rank) {
    CollectiveCall call = RingCall(view, rank, 1);
    call.running = true;
    next_table_->Collective(call, running[rank].Callback());
    EXPECT_EQ(running[rank].calls, 1);
    EXPECT_TRUE(running[rank].status().ok()) << running[rank].status();
  }
  // Rank 2 got the same plan.
  ASSERT_TRUE(left_behind.status().ok()) << left_behind.status();
  EXPECT_EQ((*left_behind.outcome)->plan.algorithm, Algorithm::kRing);
  EXPECT_EQ((*left_behind.outcome)->plan.chunk_bytes,
            (*planned[2].outcome)->plan.chunk_bytes);
  EXPECT_EQ(running[0].calls, 1);  // the verdict went nowhere
  // Every rank commits it here, and goes on at #2.
  std::vector<absl::Status> verdicts(kWorld, absl::UnknownError("none"));
  for (int rank = 0; rank < kWorld; ++rank) {
    CommitOn(*next_table_, view, rank, 1, &verdicts[rank]);
  }
  for (const absl::Status& verdict : verdicts) EXPECT_TRUE(verdict.ok());
  ExpectSecondCallMatched(view);
}

TEST_F(GroupRestoreTest,
       Collective_PlanLostForOneRankAnotherCommitting_PlannedAgain) {
  PlanLostWhileOneCommits(/*late_call_first=*/false);
}

TEST_F(GroupRestoreTest,
       Collective_PlanLostCallFirstAnotherCommitting_PlannedAgain) {
  PlanLostWhileOneCommits(/*late_call_first=*/true);
}

TEST_F(GroupRestoreTest, Commit_EveryRankHadThePlan_RunningCallsGiveWay) {
  const GroupView view = Form(*table_);
  std::vector<Answer> planned(kWorld);
  for (int rank = 0; rank < kWorld; ++rank) {
    table_->Collective(RingCall(view, rank, 1), planned[rank].Callback());
  }
  TakeOver();
  // Ranks 0 and 1 moved while running #1; rank 2 finished it first and
  // commits; then the others commit.
  Answer running;
  for (int rank = 0; rank < 2; ++rank) {
    CollectiveCall call = RingCall(view, rank, 1);
    call.running = true;
    next_table_->Collective(call, running.Callback());
  }
  std::vector<absl::Status> verdicts(kWorld, absl::UnknownError("none"));
  for (int rank : {2, 0, 1}) {
    CommitOn(*next_table_, view, rank, 1, &verdicts[rank]);
  }
  for (const absl::Status& verdict : verdicts) {
    EXPECT_TRUE(verdict.ok()) << verdict;
  }
  ExpectSecondCallMatched(view);
  EXPECT_EQ(running.calls, 2);
}

TEST_F(GroupRestoreTest,
       Collective_RunningOnGroupNotRestored_RefusedMatchesNothing) {
  const GroupView view = Form(*table_);
  Answer running;
  CollectiveCall call = RingCall(view, 0, 1);
  call.running = true;
  table_->Collective(call, running.Callback());
  EXPECT_EQ(running.calls, 1);
  EXPECT_EQ(running.status().code(), absl::StatusCode::kFailedPrecondition);
  // #1 is still the ranks' to call: nothing of it was matched.
  std::vector<Answer> first(kWorld);
  for (int rank = 0; rank < kWorld; ++rank) {
    table_->Collective(Call(view, rank, 1), first[rank].Callback());
  }
  ASSERT_TRUE(first[0].status().ok()) << first[0].status();
  EXPECT_EQ(first[0].sum(), 6);
}

TEST_F(GroupRestoreTest, Join_AnswerLostAtFailover_RetryGetsTheFormedGroup) {
  const GroupView view = Form(*table_);
  TakeOver();
  // Rank 1's answer was lost; its join goes again to the new leader.
  JoinRequest again;
  again.group = "g";
  again.world_size = kWorld;
  again.rank = 1;
  again.worker_id = workers_[1];
  again.device = Cpu();
  again.request_id = "join-1";
  std::optional<absl::StatusOr<GroupView>> got;
  next_table_->Join(again,
                    [&got](const absl::StatusOr<GroupView>& v) { got = v; });
  ASSERT_TRUE(got.has_value());
  ASSERT_TRUE(got->ok()) << got->status();
  EXPECT_EQ((*got)->epoch, view.epoch);
  EXPECT_EQ((*got)->members.size(), static_cast<size_t>(kWorld));
}

}  // namespace
}  // namespace chorus
