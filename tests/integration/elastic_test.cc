// Elastic groups from C++, with real daemons on 127.0.0.1: a worker daemon
// killed (SIGKILL) loses its rank, and the survivors' calls end with
// ABORTED and a MEMBERSHIP_CHANGED detail within the lease plus one second,
// their communicators already moved to the next epoch, where the step runs
// again; ranks embedded in this process see the same when a worker shuts
// down, and a sync with no newcomer keeps the epoch.
#include <signal.h>

#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "chorus/communicator.h"
#include "chorus/status_facts.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/collective_harness.h"
#include "tests/testing/collective_reference.h"
#include "tests/testing/daemons.h"
#include "tests/testing/failure_cluster.h"
#include "tests/testing/wait.h"

namespace chorus::test {
namespace {

using ::testing::ElementsAre;

constexpr uint64_t kCount = 16;

// Runs the all_reduce on `ranks`, each from a thread of its own.
std::vector<std::unique_ptr<BackgroundCall>> AllReduceOn(
    const std::vector<Communicator*>& ranks) {
  std::vector<std::unique_ptr<BackgroundCall>> calls;
  for (size_t rank = 0; rank < ranks.size(); ++rank) {
    calls.push_back(std::make_unique<BackgroundCall>(
        ranks[rank], AllReduceU32(kCount),
        RankInputU32(static_cast<int>(rank), kCount), FailureCallOptions()));
  }
  return calls;
}

// Expects every call to have ended with the membership change that left
// `world` ranks, and each communicator to be in that epoch already.
void ExpectMoved(const std::vector<std::unique_ptr<BackgroundCall>>& calls,
                 const std::vector<Communicator*>& ranks, int world,
                 const std::vector<int>& left) {
  std::optional<uint64_t> epoch;
  for (size_t rank = 0; rank < calls.size(); ++rank) {
    SCOPED_TRACE(absl::StrCat("rank ", rank));
    const absl::Status status = calls[rank]->status();
    ASSERT_EQ(status.code(), absl::StatusCode::kAborted) << status;
    std::optional<StatusFacts> facts = StatusFactsOf(status);
    ASSERT_TRUE(facts.has_value()) << status;
    EXPECT_EQ(facts->reason, "MEMBERSHIP_CHANGED");
    EXPECT_EQ(facts->lost_ranks, left);
    EXPECT_EQ(facts->next_world_size, world);
    EXPECT_EQ(ranks[rank]->world_size(), world);
    EXPECT_EQ(ranks[rank]->epoch(), facts->next_epoch);
    if (!epoch.has_value()) epoch = ranks[rank]->epoch();
    EXPECT_EQ(ranks[rank]->epoch(), *epoch);
  }
}

// Expects the all_reduce on `ranks` to succeed with the sum of their inputs.
void ExpectAllReduceWorks(const std::vector<Communicator*>& ranks) {
  std::vector<std::unique_ptr<BackgroundCall>> calls = AllReduceOn(ranks);
  for (auto& call : calls) {
    ASSERT_TRUE(call->WaitFor(kFailureCallTimeout));
    ASSERT_TRUE(call->status().ok()) << call->status();
    EXPECT_EQ(call->output(),
              SumOfInputsU32(static_cast<int>(ranks.size()), kCount));
  }
}

TEST(ElasticTest, KillWorkerDaemon_Survivors_MovedWithinLeasePlusOne) {
  absl::StatusOr<std::unique_ptr<FailureCluster>> cluster =
      FailureCluster::Start(
          {absl::StrCat("--lease_timeout=", absl::ToInt64Seconds(kFailureLease),
                        "s")},
          {"elastic-0", "elastic-1"});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  absl::StatusOr<int> victim = (*cluster)->AddWorker("elastic-victim");
  ASSERT_TRUE(victim.ok()) << victim.status();
  absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> joined =
      (*cluster)->Join("elastic", {0, 1, *victim}, /*min_world_size=*/2);
  ASSERT_TRUE(joined.ok()) << joined.status();
  ASSERT_TRUE(AllReduceWorks(*joined, kCount));
  const uint64_t first_epoch = (*joined)[0]->epoch();

  const absl::Time lost_at = absl::Now();
  ASSERT_TRUE((*cluster)->worker(*victim).process->Signal(SIGKILL).ok());
  const std::vector<Communicator*> survivors = {(*joined)[0].get(),
                                                (*joined)[1].get()};
  std::vector<std::unique_ptr<BackgroundCall>> calls = AllReduceOn(survivors);
  for (auto& call : calls) {
    ASSERT_TRUE(call->WaitUntilTime(lost_at + kLostWorkerBound))
        << "still waiting " << absl::Now() - lost_at << " after the kill";
  }
  ExpectMoved(calls, survivors, 2, {2});
  EXPECT_NE(survivors[0]->epoch(), first_epoch);
  EXPECT_EQ(survivors[1]->rank(), 1);
  ExpectAllReduceWorks(survivors);
}

TEST(ElasticTest, EmbeddedWorkerShutsDown_OthersMoveAndSyncKeepsEpoch) {
  absl::StatusOr<std::unique_ptr<EmbeddedCluster>> cluster =
      EmbeddedCluster::Start(3);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  std::vector<std::unique_ptr<Communicator>> joined(3);
  RunOnRanks(3, [&](int rank) {
    JoinOptions options;
    options.timeout = kFailureCallTimeout;
    options.min_world_size = 1;
    absl::StatusOr<std::unique_ptr<Communicator>> one =
        Communicator::JoinEmbedded((*cluster)->worker(rank), "elastic", 3, rank,
                                   options);
    ASSERT_TRUE(one.ok()) << one.status();
    joined[rank] = *std::move(one);
  });
  // Rank 0's worker leaves the registry (it shuts down).
  joined[0].reset();
  (*cluster)->worker(0)->Shutdown();
  const std::vector<Communicator*> survivors = {joined[1].get(),
                                                joined[2].get()};
  std::vector<std::unique_ptr<BackgroundCall>> calls = AllReduceOn(survivors);
  for (auto& call : calls) ASSERT_TRUE(call->WaitFor(kFailureCallTimeout));
  ExpectMoved(calls, survivors, 2, {0});
  EXPECT_EQ(survivors[0]->rank(), 0);
  EXPECT_EQ(survivors[1]->rank(), 1);
  ExpectAllReduceWorks(survivors);

  // With no newcomer waiting a sync keeps the membership.
  std::vector<absl::StatusOr<GroupMembership>> synced(
      2, absl::UnknownError("not run"));
  RunOnRanks(2, [&](int rank) { synced[rank] = survivors[rank]->Sync(); });
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_TRUE(synced[rank].ok()) << synced[rank].status();
    EXPECT_EQ(synced[rank]->epoch, survivors[rank]->epoch());
    EXPECT_EQ(synced[rank]->rank, rank);
    EXPECT_THAT(synced[rank]->joined, ElementsAre());
  }
}

// Runs the newcomer's case with the coordinator given `coordinator_flags`.
void NewcomerAdmittedAtTheNextSync(
    const std::vector<std::string>& coordinator_flags) {
  absl::StatusOr<std::unique_ptr<FailureCluster>> cluster =
      FailureCluster::Start(coordinator_flags, {"grow-0", "grow-1"});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> joined =
      (*cluster)->Join("grow", {0, 1}, /*min_world_size=*/1);
  ASSERT_TRUE(joined.ok()) << joined.status();
  absl::StatusOr<std::unique_ptr<Communicator>> newcomer =
      absl::UnknownError("not run");
  std::thread asking([&] {
    JoinOptions options;
    options.timeout = kFailureCallTimeout;
    newcomer =
        Communicator::JoinThroughDaemon((*cluster)->worker(1).address, "grow",
                                        0, Communicator::kNewcomer, options);
  });
  ASSERT_TRUE(WaitUntil(
      [&] {
        absl::StatusOr<v1::GroupInfo> group = (*cluster)->Group("grow");
        return group.ok() && group->joiners_waiting() == 1;
      },
      kFailureCallTimeout));
  std::vector<absl::StatusOr<GroupMembership>> synced(
      2, absl::UnknownError("not run"));
  RunOnRanks(2, [&](int rank) { synced[rank] = (*joined)[rank]->Sync(); });
  asking.join();
  ASSERT_TRUE(newcomer.ok()) << newcomer.status();
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_TRUE(synced[rank].ok()) << synced[rank].status();
    EXPECT_EQ(synced[rank]->world_size, 3);
    EXPECT_THAT(synced[rank]->joined, ElementsAre(2));
  }
  EXPECT_EQ((*newcomer)->rank(), 2);
  EXPECT_EQ((*newcomer)->world_size(), 3);
  EXPECT_EQ((*newcomer)->epoch(), (*joined)[0]->epoch());
  ExpectAllReduceWorks(
      {(*joined)[0].get(), (*joined)[1].get(), newcomer->get()});
  std::vector<std::unique_ptr<Communicator>> grown;
  for (auto& rank : *joined) grown.push_back(std::move(rank));
  grown.push_back(*std::move(newcomer));
  EXPECT_TRUE(AllReduceWorks(grown, 1 << 16, Algorithm::kRing));
}

TEST(ElasticTest, JoinThroughDaemon_Newcomer_AdmittedAtTheNextSync) {
  NewcomerAdmittedAtTheNextSync({});
}

// A sync's next epoch without its member list (a group above
// --member_list_max): the members and the newcomer fetch their peers.
TEST(ElasticTest, JoinThroughDaemon_NewcomerMembersUnlisted_AdmittedAndRing) {
  NewcomerAdmittedAtTheNextSync({"--member_list_max=0"});
}

}  // namespace
}  // namespace chorus::test
