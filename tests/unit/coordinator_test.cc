// The coordinator core's cross rules on a fake clock: a worker that is
// evicted, deregisters or restarts aborts its groups, its peers hear of it in
// their heartbeats, and waiting calls end at the core's deadline.
#include "server/coordinator/coordinator.h"

#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/fake_clock.h"

namespace chorus {
namespace {

using ::testing::HasSubstr;
using ::testing::SizeIs;

constexpr absl::Duration kLease = absl::Seconds(5);

Device Cpu() {
  Device d;
  d.kind = DeviceKind::kCpu;
  return d;
}

class CoordinatorTest : public ::testing::Test {
 protected:
  CoordinatorTest() : core_(&clock_, Options()) {
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

  FakeClock clock_;
  Coordinator core_;
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

TEST_F(CoordinatorTest, AuthorizeWorker_OwnOtherAndUnknownIds) {
  EXPECT_TRUE(core_.AuthorizeWorker("w0", ids_[0]).ok());
  const absl::Status other = core_.AuthorizeWorker("w0", ids_[1]);
  EXPECT_TRUE(absl::IsPermissionDenied(other)) << other;
  EXPECT_THAT(other.message(), HasSubstr("\"w0\" may not act for worker"));
  // An unknown id is the call's own NOT_FOUND to give.
  EXPECT_TRUE(core_.AuthorizeWorker("w0", 999).ok());
}

TEST_F(CoordinatorTest, AuthorizeRank_OwnOtherStaleAndUnknownRanks) {
  const uint64_t epoch = FormGroup();
  EXPECT_TRUE(core_.AuthorizeRank("w0", "g", epoch, 0).ok());
  EXPECT_TRUE(core_.AuthorizeRank("w1", "g", epoch, 1).ok());
  const absl::Status other = core_.AuthorizeRank("w0", "g", epoch, 1);
  EXPECT_TRUE(absl::IsPermissionDenied(other)) << other;
  EXPECT_THAT(other.message(),
              HasSubstr("may not act for rank 1 of group g: worker \"w1\" "
                        "holds it"));
  // The calls themselves refuse these.
  EXPECT_TRUE(core_.AuthorizeRank("w0", "g", epoch + 1, 1).ok());
  EXPECT_TRUE(core_.AuthorizeRank("w0", "g", epoch, 7).ok());
  EXPECT_TRUE(core_.AuthorizeRank("w0", "nope", epoch, 1).ok());
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

TEST(CoreDeadlineTest, CoreDeadline_NoClientDeadline_MaxWaitLessMargin) {
  const absl::Time now = absl::FromUnixSeconds(1000);
  EXPECT_EQ(CoreDeadline(now, absl::InfiniteFuture(), absl::Minutes(10)),
            now + absl::Minutes(10) - absl::Milliseconds(250));
  EXPECT_EQ(CoreDeadline(now, now + absl::Milliseconds(20), absl::Minutes(10)),
            now + absl::Milliseconds(15));
}

}  // namespace
}  // namespace chorus
