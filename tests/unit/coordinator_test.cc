// The coordinator core's cross rules on a fake clock: a worker that is
// evicted, deregisters or restarts aborts its groups, its peers hear of it in
// their heartbeats, and waiting calls end at the core's deadline; and the
// events each of those publishes to the event stream.
#include "server/coordinator/coordinator.h"

#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_detail.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/fake_clock.h"

namespace chorus {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;

constexpr absl::Duration kLease = absl::Seconds(5);

Device Cpu() {
  Device d;
  d.kind = DeviceKind::kCpu;
  return d;
}

Identity WorkerIdentity(const std::string& name) {
  return Identity{Role::kWorker, name, ""};
}

class CoordinatorTest : public ::testing::Test {
 protected:
  CoordinatorTest() : core_(&clock_, Options()) {
    // The wake calls back into the core, which it could not do under the
    // core's locks.
    watcher_ = core_.SubscribeEvents([this] {
      ++wakes_;
      core_.Groups();
    });
    for (int w = 0; w < 2; ++w) {
      absl::StatusOr<RegisterResult> registered = core_.Register(Worker(w, 1));
      EXPECT_TRUE(registered.ok()) << registered.status();
      ids_[w] = registered.ok() ? registered->worker_id : 0;
    }
  }

  static CoordinatorOptions Options() {
    CoordinatorOptions options;
    options.lease_timeout = kLease;
    return options;
  }

  static WorkerRegistration Worker(int w, uint64_t incarnation) {
    WorkerRegistration r;
    r.name = absl::StrCat("w", w);
    r.host = absl::StrCat("h", w);
    r.address = absl::StrCat("h", w, ":7000");
    r.incarnation = incarnation;
    r.devices = {Cpu()};
    return r;
  }

  // Forms group "g" with rank r on worker r; returns its epoch.
  uint64_t FormGroup() {
    uint64_t epoch = 0;
    for (int rank = 0; rank < 2; ++rank) {
      JoinRequest join;
      join.group = "g";
      join.world_size = 2;
      join.rank = rank;
      join.worker_id = ids_[rank];
      join.device = Cpu();
      join.deadline = clock_.Now() + absl::Seconds(30);
      core_.Join(std::move(join), [&epoch](absl::StatusOr<GroupView> view) {
        if (view.ok()) epoch = view->epoch;
      });
    }
    EXPECT_NE(epoch, 0u);
    return epoch;
  }

  // Starts a barrier of `rank` and returns where its verdict lands.
  std::optional<absl::Status>* Barrier(uint64_t epoch, int rank,
                                       uint64_t sequence,
                                       absl::Duration timeout) {
    auto* verdict = &verdicts_[rank];
    verdict->reset();
    CollectiveCall call;
    call.group = "g";
    call.epoch = epoch;
    call.rank = rank;
    call.sequence = sequence;
    call.spec.kind = CollectiveKind::kBarrier;
    call.deadline = clock_.Now() + timeout;
    core_.Collective(std::move(call),
                     [verdict](absl::StatusOr<CollectiveOutcome> outcome) {
                       *verdict = outcome.status();
                     });
    return verdict;
  }

  // Takes the events published since the last call.
  std::vector<Event> TakeEvents() {
    std::vector<Event> events;
    Event event;
    while (core_.NextEvent(watcher_, &event) == EventHub::Poll::kEvent) {
      events.push_back(event);
    }
    return events;
  }

  // The kinds of `events`, e.g. {"WORKER_LOST", "GROUP_ABORTED"}.
  static std::vector<std::string> Kinds(const std::vector<Event>& events) {
    std::vector<std::string> kinds;
    for (const Event& event : events) {
      kinds.push_back(EventKindName(event.kind));
    }
    return kinds;
  }

  FakeClock clock_;
  Coordinator core_;
  uint64_t watcher_ = 0;
  int wakes_ = 0;
  uint64_t ids_[2] = {0, 0};
  std::optional<absl::Status> verdicts_[2];
};

TEST_F(CoordinatorTest, RunTimers_WorkerMissesLease_GroupAbortedAndNoticed) {
  const uint64_t epoch = FormGroup();
  std::optional<absl::Status>* waiting =
      Barrier(epoch, 1, 1, absl::Seconds(60));
  ASSERT_FALSE(waiting->has_value());

  // Worker 1 keeps its lease; worker 0 sends nothing.
  HeartbeatReply reply;
  clock_.Advance(absl::Seconds(3));
  ASSERT_TRUE(core_.Heartbeat(ids_[1], 1, 0, &reply).ok());
  clock_.Advance(absl::Seconds(3));
  core_.RunTimers();

  ASSERT_TRUE(waiting->has_value());
  EXPECT_TRUE(absl::IsAborted(**waiting)) << **waiting;
  EXPECT_THAT((*waiting)->message(), HasSubstr("rank 0 on worker \"w0\""));
  EXPECT_THAT((*waiting)->message(),
              HasSubstr("no heartbeat within the lease"));
  ASSERT_THAT(core_.Workers(), SizeIs(1));
  EXPECT_EQ(core_.Workers()[0].id, ids_[1]);

  ASSERT_TRUE(core_.Heartbeat(ids_[1], 1, 0, &reply).ok());
  ASSERT_THAT(reply.aborts, SizeIs(1));
  EXPECT_EQ(reply.aborts[0].group, "g");
  EXPECT_EQ(reply.aborts[0].epoch, epoch);
  EXPECT_EQ(reply.aborts_latest, reply.aborts[0].id);
  // The evicted worker is unknown from then on.
  EXPECT_TRUE(absl::IsNotFound(core_.Heartbeat(ids_[0], 1, 0, &reply)));

  // A later call on the aborted epoch gets the same verdict at once.
  std::optional<absl::Status>* later = Barrier(epoch, 1, 2, absl::Seconds(60));
  ASSERT_TRUE(later->has_value());
  EXPECT_TRUE(absl::IsAborted(**later)) << **later;
}

TEST_F(CoordinatorTest, RunTimers_LeasesRenewed_NothingAborted) {
  const uint64_t epoch = FormGroup();
  HeartbeatReply reply;
  for (int i = 0; i < 4; ++i) {
    clock_.Advance(kLease / 2);
    ASSERT_TRUE(core_.Heartbeat(ids_[0], 1, 0, &reply).ok());
    ASSERT_TRUE(core_.Heartbeat(ids_[1], 1, 0, &reply).ok());
    core_.RunTimers();
  }
  EXPECT_THAT(reply.aborts, SizeIs(0));
  EXPECT_THAT(core_.Workers(), SizeIs(2));
  Barrier(epoch, 0, 1, absl::Seconds(10));
  std::optional<absl::Status>* last = Barrier(epoch, 1, 1, absl::Seconds(10));
  ASSERT_TRUE(last->has_value());
  EXPECT_TRUE((*last)->ok()) << **last;
}

TEST_F(CoordinatorTest, RunTimers_JoinsButNoHeartbeat_LeaseKept) {
  // Worker 0's heartbeats wait behind a burst of its joins; the joins
  // arrive. Worker 1 sends nothing at all.
  for (int i = 0; i < 4; ++i) {
    clock_.Advance(kLease / 2);
    JoinRequest join;
    join.group = absl::StrCat("pending-", i);
    join.world_size = 2;
    join.rank = 0;
    join.worker_id = ids_[0];
    join.device = Cpu();
    join.deadline = clock_.Now() + absl::Seconds(60);
    core_.Join(std::move(join), [](absl::StatusOr<GroupView>) {});
    core_.RunTimers();
  }
  ASSERT_THAT(core_.Workers(), SizeIs(1));
  EXPECT_EQ(core_.Workers()[0].id, ids_[0]);
}

TEST_F(CoordinatorTest, SweepLeases_RunsLateAfterPause_FreshLeaseNotEviction) {
  const uint64_t epoch = FormGroup();
  // The timer was due a lease from now; the coordinator then stood still
  // for three leases and heard no heartbeat meanwhile.
  const absl::Time due = clock_.Now() + kLease;
  clock_.Advance(3 * kLease);
  core_.SweepLeases(due);
  EXPECT_THAT(core_.Workers(), SizeIs(2));

  // Worker 1 heartbeats within the fresh lease; worker 0 does not.
  HeartbeatReply reply;
  clock_.Advance(kLease / 2);
  ASSERT_TRUE(core_.Heartbeat(ids_[1], 1, 0, &reply).ok());
  clock_.Advance(kLease / 2 + absl::Milliseconds(1));
  core_.SweepLeases(clock_.Now());
  ASSERT_THAT(core_.Workers(), SizeIs(1));
  EXPECT_EQ(core_.Workers()[0].id, ids_[1]);
  std::optional<absl::Status>* later = Barrier(epoch, 1, 1, absl::Seconds(60));
  ASSERT_TRUE(later->has_value());
  EXPECT_TRUE(absl::IsAborted(**later)) << **later;
}

// Whether a coordinator leads, as a test says.
class SwitchedLeadership final : public Leadership {
 public:
  absl::Status CheckLeading() const override {
    return leading ? absl::OkStatus()
                   : absl::UnavailableError("a standby for this test");
  }
  bool leading = true;
};

TEST(CoordinatorLeadershipTest, SweepLeases_NotLeading_FreshLeaseNotEviction) {
  FakeClock clock;
  SwitchedLeadership leadership;
  CoordinatorOptions options;
  options.lease_timeout = kLease;
  options.leadership = &leadership;
  Coordinator core(&clock, options);
  WorkerRegistration worker;
  worker.name = "w0";
  worker.address = "h0:7000";
  worker.incarnation = 1;
  worker.devices = {Cpu()};
  ASSERT_TRUE(core.Register(worker).ok());
  // Its doors refuse heartbeats while it is unsure it leads: the silence
  // is not the worker's.
  leadership.leading = false;
  clock.Advance(kLease + absl::Milliseconds(1));
  core.SweepLeases(clock.Now());
  EXPECT_THAT(core.Workers(), SizeIs(1));
  // Leading again, the worker has a lease from then on to heartbeat in.
  leadership.leading = true;
  clock.Advance(kLease / 2);
  core.SweepLeases(clock.Now());
  EXPECT_THAT(core.Workers(), SizeIs(1));
  clock.Advance(kLease);
  core.SweepLeases(clock.Now());
  EXPECT_THAT(core.Workers(), SizeIs(0));
}

TEST(CoordinatorLeadershipTest, Restore_TakesOverAndPublishesLeaderElected) {
  FakeClock clock;
  CoordinatorOptions options;
  options.lease_timeout = kLease;
  Coordinator core(&clock, options);
  const uint64_t watcher = core.SubscribeEvents([] {});
  StoredState state;
  WorkerRecord worker;
  worker.id = 7;
  worker.registration.name = "w7";
  worker.registration.address = "h7:7000";
  worker.registration.incarnation = 3;
  worker.registration.devices = {Cpu()};
  state.workers = {worker};
  state.keys = {StoredKey{"", "k", "v"}};
  core.Restore(state);
  Event event;
  ASSERT_EQ(core.NextEvent(watcher, &event), EventHub::Poll::kEvent);
  EXPECT_EQ(event.kind, Event::Kind::kLeaderElected);
  EXPECT_THAT(event.text, HasSubstr("1 workers, 0 groups and 1 store keys"));
  // The worker heartbeats under its id; a new one gets a higher id.
  HeartbeatReply reply;
  EXPECT_TRUE(core.Heartbeat(7, 3, 0, &reply).ok());
  WorkerRegistration fresh = worker.registration;
  fresh.name = "w8";
  EXPECT_GT(core.Register(fresh)->worker_id, 7u);
  core.UnsubscribeEvents(watcher);
}

TEST_F(CoordinatorTest, SweepLeases_OnTime_ExpiredLeaseEvicted) {
  FormGroup();
  clock_.Advance(kLease + absl::Milliseconds(1));
  // Due just now: the timer ran on time, so the silence is the workers'.
  core_.SweepLeases(clock_.Now() - absl::Milliseconds(1));
  EXPECT_THAT(core_.Workers(), SizeIs(0));
}

TEST_F(CoordinatorTest, AuthorizeWorker_OwnOtherAndUnknownIds) {
  EXPECT_TRUE(core_.AuthorizeWorker(WorkerIdentity("w0"), ids_[0]).ok());
  const absl::Status other =
      core_.AuthorizeWorker(WorkerIdentity("w0"), ids_[1]);
  EXPECT_TRUE(absl::IsPermissionDenied(other)) << other;
  EXPECT_THAT(other.message(), HasSubstr("\"w0\" may not act for worker"));
  // An unknown id is the call's own NOT_FOUND to give.
  EXPECT_TRUE(core_.AuthorizeWorker(WorkerIdentity("w0"), 999).ok());
}

TEST_F(CoordinatorTest, AuthorizeRank_OwnOtherStaleAndUnknownRanks) {
  const uint64_t epoch = FormGroup();
  EXPECT_TRUE(core_.AuthorizeRank(WorkerIdentity("w0"), "g", epoch, 0).ok());
  EXPECT_TRUE(core_.AuthorizeRank(WorkerIdentity("w1"), "g", epoch, 1).ok());
  const absl::Status other =
      core_.AuthorizeRank(WorkerIdentity("w0"), "g", epoch, 1);
  EXPECT_TRUE(absl::IsPermissionDenied(other)) << other;
  EXPECT_THAT(other.message(),
              HasSubstr("may not act for rank 1 of group g: worker \"w1\" "
                        "holds it"));
  // The calls themselves refuse these.
  EXPECT_TRUE(
      core_.AuthorizeRank(WorkerIdentity("w0"), "g", epoch + 1, 1).ok());
  EXPECT_TRUE(core_.AuthorizeRank(WorkerIdentity("w0"), "g", epoch, 7).ok());
  EXPECT_TRUE(core_.AuthorizeRank(WorkerIdentity("w0"), "nope", epoch, 1).ok());
  // Checking changed nothing: rank 1's barrier is still its first call.
  std::optional<absl::Status>* first = Barrier(epoch, 0, 1, absl::Seconds(5));
  std::optional<absl::Status>* second = Barrier(epoch, 1, 1, absl::Seconds(5));
  ASSERT_TRUE(first->has_value() && second->has_value());
  EXPECT_TRUE((*first)->ok()) << **first;
  EXPECT_TRUE((*second)->ok()) << **second;
}

TEST_F(CoordinatorTest, Deregister_Member_GroupAborted) {
  const uint64_t epoch = FormGroup();
  std::optional<absl::Status>* waiting =
      Barrier(epoch, 1, 1, absl::Seconds(60));
  ASSERT_TRUE(core_.Deregister(ids_[0], 1).ok());
  ASSERT_TRUE(waiting->has_value());
  EXPECT_TRUE(absl::IsAborted(**waiting)) << **waiting;
  EXPECT_THAT((*waiting)->message(), HasSubstr("it shut down"));
}

TEST_F(CoordinatorTest, Deregister_OtherIncarnation_RefusedNothingAborted) {
  const uint64_t epoch = FormGroup();
  EXPECT_TRUE(absl::IsFailedPrecondition(core_.Deregister(ids_[0], 2)));
  EXPECT_THAT(core_.Workers(), SizeIs(2));
  Barrier(epoch, 0, 1, absl::Seconds(10));
  std::optional<absl::Status>* last = Barrier(epoch, 1, 1, absl::Seconds(10));
  ASSERT_TRUE(last->has_value());
  EXPECT_TRUE((*last)->ok()) << **last;
}

TEST_F(CoordinatorTest, Register_NewIncarnation_OldGroupsAborted) {
  const uint64_t epoch = FormGroup();
  std::optional<absl::Status>* waiting =
      Barrier(epoch, 1, 1, absl::Seconds(60));
  absl::StatusOr<RegisterResult> again = core_.Register(Worker(0, 2));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->replaced);
  ASSERT_TRUE(waiting->has_value());
  EXPECT_TRUE(absl::IsAborted(**waiting)) << **waiting;
  EXPECT_THAT((*waiting)->message(), HasSubstr("new incarnation"));
}

TEST_F(CoordinatorTest, RunTimers_CallPastCoreDeadline_EndsBeforeClientDoes) {
  const uint64_t epoch = FormGroup();
  // A client deadline 10 s away: the core ends the call 250 ms before it.
  std::optional<absl::Status>* waiting =
      Barrier(epoch, 0, 1, absl::Seconds(10));
  EXPECT_EQ(core_.NextDeadline(),
            clock_.Now() + absl::Seconds(10) - absl::Milliseconds(250));
  HeartbeatReply reply;
  clock_.Advance(absl::Milliseconds(9700));
  ASSERT_TRUE(core_.Heartbeat(ids_[0], 1, 0, &reply).ok());
  ASSERT_TRUE(core_.Heartbeat(ids_[1], 1, 0, &reply).ok());
  core_.RunTimers();
  EXPECT_FALSE(waiting->has_value());
  clock_.Advance(absl::Milliseconds(100));
  core_.RunTimers();
  ASSERT_TRUE(waiting->has_value());
  EXPECT_TRUE(absl::IsDeadlineExceeded(**waiting)) << **waiting;
  EXPECT_THAT((*waiting)->message(), HasSubstr("rank 1"));
}

TEST_F(CoordinatorTest, Register_NewWorkers_WorkerRegisteredEvents) {
  const std::vector<Event> events = TakeEvents();
  ASSERT_THAT(Kinds(events),
              ElementsAre("WORKER_REGISTERED", "WORKER_REGISTERED"));
  EXPECT_EQ(events[0].worker_id, ids_[0]);
  EXPECT_EQ(events[0].worker_name, "w0");
  EXPECT_EQ(events[0].time, clock_.Now());
  EXPECT_THAT(events[0].text, HasSubstr("registered at h0:7000"));
  EXPECT_THAT(events[0].text, HasSubstr("with Cpu"));
  EXPECT_EQ(events[1].worker_name, "w1");
  EXPECT_GE(wakes_, 1);
  // A retried registration is no event.
  ASSERT_TRUE(core_.Register(Worker(0, 1)).ok());
  EXPECT_THAT(TakeEvents(), IsEmpty());
}

TEST_F(CoordinatorTest, Join_EveryRank_GroupFormedEvent) {
  TakeEvents();
  const uint64_t epoch = FormGroup();
  const std::vector<Event> events = TakeEvents();
  ASSERT_THAT(Kinds(events), ElementsAre("GROUP_FORMED"));
  EXPECT_EQ(events[0].group, "g");
  EXPECT_EQ(events[0].epoch, epoch);
  EXPECT_THAT(events[0].text,
              HasSubstr("formed at epoch " + std::to_string(epoch) +
                        " with 2 ranks: rank 0 on worker"));
}

TEST_F(CoordinatorTest, RunTimers_WorkerMissesLease_LostThenAbortedEvents) {
  const uint64_t epoch = FormGroup();
  TakeEvents();
  HeartbeatReply reply;
  clock_.Advance(absl::Seconds(3));
  ASSERT_TRUE(core_.Heartbeat(ids_[1], 1, 0, &reply).ok());
  clock_.Advance(absl::Seconds(3));
  const int wakes = wakes_;
  core_.RunTimers();
  EXPECT_GT(wakes_, wakes);

  const std::vector<Event> events = TakeEvents();
  ASSERT_THAT(Kinds(events), ElementsAre("WORKER_LOST", "GROUP_ABORTED"));
  EXPECT_EQ(events[0].worker_id, ids_[0]);
  EXPECT_EQ(events[0].worker_name, "w0");
  EXPECT_EQ(events[0].reason, "evicted");
  EXPECT_THAT(events[0].text,
              HasSubstr("\"w0\" lost: no heartbeat within the lease (5s)"));
  EXPECT_EQ(events[1].group, "g");
  EXPECT_EQ(events[1].epoch, epoch);
  EXPECT_THAT(events[1].ranks, ElementsAre(0));
  EXPECT_EQ(events[1].worker_id, ids_[0]);
  EXPECT_EQ(events[1].worker_name, "w0");
  EXPECT_TRUE(absl::IsAborted(events[1].status)) << events[1].status;
  const std::optional<v1::ErrorDetail> detail = ErrorDetailOf(events[1].status);
  ASSERT_TRUE(detail.has_value());
  EXPECT_EQ(detail->reason(), "WORKER_LOST");
  EXPECT_EQ(detail->group(), "g");
  EXPECT_EQ(detail->epoch(), epoch);
  EXPECT_EQ(detail->lost_worker(), "w0");
  EXPECT_EQ(detail->lost_worker_id(), ids_[0]);
  EXPECT_THAT(detail->lost_ranks(), ElementsAre(0));
  EXPECT_THAT(events[1].text, HasSubstr("rank 0 on worker \"w0\""));
}

TEST_F(CoordinatorTest, Deregister_Member_LostThenAbortedEvents) {
  FormGroup();
  TakeEvents();
  ASSERT_TRUE(core_.Deregister(ids_[1], 1).ok());
  const std::vector<Event> events = TakeEvents();
  ASSERT_THAT(Kinds(events), ElementsAre("WORKER_LOST", "GROUP_ABORTED"));
  EXPECT_EQ(events[0].reason, "deregistered");
  EXPECT_EQ(events[0].worker_name, "w1");
  EXPECT_THAT(events[1].ranks, ElementsAre(1));
  EXPECT_THAT(events[1].status.message(), HasSubstr("it shut down"));
}

TEST_F(CoordinatorTest, Register_NewIncarnation_ReplacedAbortedRegistered) {
  FormGroup();
  TakeEvents();
  absl::StatusOr<RegisterResult> again = core_.Register(Worker(0, 2));
  ASSERT_TRUE(again.ok()) << again.status();
  const std::vector<Event> events = TakeEvents();
  ASSERT_THAT(Kinds(events),
              ElementsAre("WORKER_LOST", "GROUP_ABORTED", "WORKER_REGISTERED"));
  EXPECT_EQ(events[0].reason, "replaced");
  EXPECT_EQ(events[0].worker_id, ids_[0]);
  EXPECT_THAT(events[1].status.message(), HasSubstr("new incarnation"));
  EXPECT_EQ(events[2].worker_id, again->worker_id);
  EXPECT_THAT(events[2].text, HasSubstr("incarnation 2"));
}

TEST_F(CoordinatorTest, Collective_RanksDisagree_MismatchEvent) {
  const uint64_t epoch = FormGroup();
  TakeEvents();
  Barrier(epoch, 0, 1, absl::Seconds(10));
  CollectiveCall call;
  call.group = "g";
  call.epoch = epoch;
  call.rank = 1;
  call.sequence = 1;
  call.spec.kind = CollectiveKind::kAllReduce;
  call.spec.dtype = DType::kF32;
  call.spec.count = 4;
  call.spec.op = ReduceOp::kSum;
  call.deadline = clock_.Now() + absl::Seconds(10);
  std::optional<absl::Status> verdict;
  core_.Collective(std::move(call),
                   [&verdict](absl::StatusOr<CollectiveOutcome> outcome) {
                     verdict = outcome.status();
                   });
  ASSERT_TRUE(verdict.has_value());
  ASSERT_TRUE(absl::IsInvalidArgument(*verdict)) << *verdict;

  const std::vector<Event> events = TakeEvents();
  ASSERT_THAT(Kinds(events), ElementsAre("MISMATCH"));
  EXPECT_EQ(events[0].epoch, epoch);
  EXPECT_EQ(events[0].sequence, 1u);
  EXPECT_THAT(events[0].ranks, ElementsAre(1));
  EXPECT_EQ(events[0].status, *verdict);
  EXPECT_THAT(events[0].text, HasSubstr("does not match across ranks"));
}

TEST_F(CoordinatorTest, RunTimers_CallPastDeadline_DeadlineEvent) {
  const uint64_t epoch = FormGroup();
  TakeEvents();
  std::optional<absl::Status>* waiting = Barrier(epoch, 0, 1, absl::Seconds(2));
  clock_.Advance(absl::Seconds(2));
  core_.RunTimers();
  ASSERT_TRUE(waiting->has_value());

  const std::vector<Event> events = TakeEvents();
  ASSERT_THAT(Kinds(events), ElementsAre("DEADLINE"));
  EXPECT_EQ(events[0].group, "g");
  EXPECT_EQ(events[0].sequence, 1u);
  EXPECT_THAT(events[0].ranks, ElementsAre(1));
  EXPECT_EQ(events[0].status, **waiting);
  EXPECT_THAT(events[0].text, HasSubstr("rank 1 of group g did not reach"));
}

TEST_F(CoordinatorTest, Join_RankMissingAtDeadline_DeadlineEvent) {
  TakeEvents();
  JoinRequest join;
  join.group = "lonely";
  join.world_size = 2;
  join.rank = 0;
  join.worker_id = ids_[0];
  join.device = Cpu();
  join.deadline = clock_.Now() + absl::Seconds(2);
  std::optional<absl::Status> verdict;
  core_.Join(std::move(join), [&verdict](absl::StatusOr<GroupView> view) {
    verdict = view.status();
  });
  clock_.Advance(absl::Seconds(2));
  core_.RunTimers();
  ASSERT_TRUE(verdict.has_value());

  const std::vector<Event> events = TakeEvents();
  ASSERT_THAT(Kinds(events), ElementsAre("DEADLINE"));
  EXPECT_EQ(events[0].group, "lonely");
  EXPECT_EQ(events[0].epoch, 0u);
  EXPECT_EQ(events[0].sequence, 0u);
  EXPECT_THAT(events[0].ranks, ElementsAre(1));
  EXPECT_TRUE(absl::IsDeadlineExceeded(events[0].status));
}

TEST_F(CoordinatorTest, NewStalls_CallWaitsThenCompletes_StallStartedEnded) {
  const uint64_t epoch = FormGroup();
  TakeEvents();
  Barrier(epoch, 0, 1, absl::Seconds(60));
  clock_.Advance(absl::Seconds(11));
  ASSERT_THAT(core_.NewStalls(absl::Seconds(10)), SizeIs(1));
  std::vector<Event> events = TakeEvents();
  ASSERT_THAT(Kinds(events), ElementsAre("STALL_STARTED"));
  EXPECT_EQ(events[0].epoch, epoch);
  EXPECT_EQ(events[0].sequence, 1u);
  EXPECT_THAT(events[0].ranks, ElementsAre(1));
  EXPECT_EQ(events[0].text, "barrier #1 of group g has waited 11s for rank 1");
  // Reported once.
  EXPECT_THAT(core_.NewStalls(absl::Seconds(10)), IsEmpty());
  EXPECT_THAT(TakeEvents(), IsEmpty());

  clock_.Advance(absl::Seconds(1));
  std::optional<absl::Status>* last = Barrier(epoch, 1, 1, absl::Seconds(60));
  ASSERT_TRUE(last->has_value());
  events = TakeEvents();
  ASSERT_THAT(Kinds(events), ElementsAre("STALL_ENDED"));
  EXPECT_EQ(events[0].sequence, 1u);
  EXPECT_TRUE(events[0].status.ok()) << events[0].status;
  EXPECT_THAT(events[0].text, HasSubstr("stopped waiting after 12s"));
}

TEST_F(CoordinatorTest, NewStalls_GroupAbortedWhileStalled_StallEnded) {
  const uint64_t epoch = FormGroup();
  Barrier(epoch, 0, 1, absl::Seconds(60));
  clock_.Advance(absl::Seconds(11));
  ASSERT_THAT(core_.NewStalls(absl::Seconds(10)), SizeIs(1));
  TakeEvents();
  ASSERT_TRUE(core_.Deregister(ids_[1], 1).ok());
  const std::vector<Event> events = TakeEvents();
  ASSERT_THAT(Kinds(events),
              ElementsAre("WORKER_LOST", "GROUP_ABORTED", "STALL_ENDED"));
  EXPECT_EQ(events[2].sequence, 1u);
  EXPECT_TRUE(absl::IsAborted(events[2].status)) << events[2].status;
}

TEST_F(CoordinatorTest, Shutdown_Watcher_GroupAbortedThenClosed) {
  FormGroup();
  TakeEvents();
  core_.Shutdown(absl::UnavailableError("shutting down"));
  const std::vector<Event> events = TakeEvents();
  ASSERT_THAT(Kinds(events), ElementsAre("GROUP_ABORTED"));
  EXPECT_TRUE(absl::IsUnavailable(events[0].status));
  Event event;
  EXPECT_EQ(core_.NextEvent(watcher_, &event), EventHub::Poll::kClosed);
}

TEST(CoordinatorEventsTest, NextEvent_SlowWatcher_EventsDropped) {
  FakeClock clock;
  CoordinatorOptions options;
  options.event_queue_limit = 2;
  Coordinator core(&clock, options);
  const uint64_t watcher = core.SubscribeEvents([] {});
  for (int w = 0; w < 5; ++w) {
    WorkerRegistration r;
    r.name = absl::StrCat("w", w);
    r.address = absl::StrCat("h", w, ":7000");
    r.incarnation = 1;
    r.devices = {Cpu()};
    ASSERT_TRUE(core.Register(r).ok());
  }
  std::vector<std::string> seen;
  Event event;
  while (core.NextEvent(watcher, &event) == EventHub::Poll::kEvent) {
    seen.push_back(event.kind == Event::Kind::kEventsDropped
                       ? absl::StrCat("dropped ", event.dropped)
                       : event.worker_name);
  }
  EXPECT_THAT(seen, ElementsAre("dropped 3", "w3", "w4"));
  core.UnsubscribeEvents(watcher);
  EXPECT_EQ(core.NextEvent(watcher, &event), EventHub::Poll::kClosed);
}

TEST(CoreDeadlineTest, CoreDeadline_NoClientDeadline_MaxWaitLessMargin) {
  const absl::Time now = absl::FromUnixSeconds(1000);
  EXPECT_EQ(CoreDeadline(now, absl::InfiniteFuture(), absl::Minutes(10)),
            now + absl::Minutes(10) - absl::Milliseconds(250));
  EXPECT_EQ(CoreDeadline(now, now + absl::Milliseconds(20), absl::Minutes(10)),
            now + absl::Milliseconds(15));
}

}  // namespace
}  // namespace chorus
