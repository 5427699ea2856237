// Unit tests of PeerDirectory: who holds each rank, epochs not learned yet,
// and waiters.

#include "server/worker/dataplane/peer_directory.h"

#include <optional>

#include "gtest/gtest.h"

namespace chorus {
namespace {

using Verdict = PeerDirectory::Verdict;

TEST(PeerDirectoryTest, Check_LearnedEpoch_MemberOnlyForTheRanksWorker) {
  PeerDirectory directory;
  directory.Learn("g", 5, {"w0", "w1"});
  EXPECT_EQ(directory.Check("g", 5, 0, "w0"), Verdict::kMember);
  EXPECT_EQ(directory.Check("g", 5, 1, "w1"), Verdict::kMember);
  EXPECT_EQ(directory.Check("g", 5, 1, "w0"), Verdict::kNotMember);
  EXPECT_EQ(directory.Check("g", 5, 2, "w0"), Verdict::kNotMember);
  EXPECT_EQ(directory.Check("g", 5, -1, "w0"), Verdict::kNotMember);
}

TEST(PeerDirectoryTest, Check_UnlearnedEpochs_UnknownWhenNewerElseNotMember) {
  PeerDirectory directory;
  EXPECT_EQ(directory.Check("g", 5, 0, "w0"), Verdict::kUnknown);
  directory.Learn("g", 5, {"w0"});
  EXPECT_EQ(directory.Check("g", 6, 0, "w0"), Verdict::kUnknown);
  EXPECT_EQ(directory.Check("g", 4, 0, "w0"), Verdict::kNotMember);
  EXPECT_EQ(directory.Check("h", 5, 0, "w0"), Verdict::kUnknown);
}

TEST(PeerDirectoryTest, Learn_ManyEpochs_OldestForgotten) {
  PeerDirectory directory;
  for (uint64_t epoch = 1; epoch <= 10; ++epoch) {
    directory.Learn("g", epoch, {"w0"});
  }
  EXPECT_EQ(directory.Check("g", 10, 0, "w0"), Verdict::kMember);
  EXPECT_EQ(directory.Check("g", 7, 0, "w0"), Verdict::kMember);
  EXPECT_EQ(directory.Check("g", 1, 0, "w0"), Verdict::kNotMember);
}

TEST(PeerDirectoryTest, WaitFor_KnownEpoch_AnswersAtOnceWithoutCallback) {
  PeerDirectory directory;
  directory.Learn("g", 5, {"w0"});
  Verdict verdict = Verdict::kUnknown;
  bool called = false;
  EXPECT_EQ(directory.WaitFor("g", 5, 0, "w1", &verdict,
                              [&](Verdict) { called = true; }),
            0u);
  EXPECT_EQ(verdict, Verdict::kNotMember);
  EXPECT_FALSE(called);
}

TEST(PeerDirectoryTest, WaitFor_EpochLearnedLater_CallbackGetsVerdict) {
  PeerDirectory directory;
  Verdict verdict = Verdict::kMember;
  std::optional<Verdict> later;
  const uint64_t token = directory.WaitFor(
      "g", 5, 1, "w1", &verdict, [&](Verdict known) { later = known; });
  EXPECT_NE(token, 0u);
  EXPECT_EQ(verdict, Verdict::kUnknown);
  directory.Learn("other", 5, {"w0", "w1"});
  EXPECT_FALSE(later.has_value());
  directory.Learn("g", 5, {"w0", "w1"});
  ASSERT_TRUE(later.has_value());
  EXPECT_EQ(*later, Verdict::kMember);
  EXPECT_FALSE(directory.Cancel(token));
}

TEST(PeerDirectoryTest, Cancel_PendingWaiter_CallbackNeverRuns) {
  PeerDirectory directory;
  Verdict verdict;
  bool called = false;
  const uint64_t token = directory.WaitFor("g", 5, 0, "w0", &verdict,
                                           [&](Verdict) { called = true; });
  EXPECT_TRUE(directory.Cancel(token));
  directory.Learn("g", 5, {"w0"});
  EXPECT_FALSE(called);
}

TEST(PeerDirectoryTest, WorkerName_LearnedAndUnknown) {
  PeerDirectory directory;
  directory.Learn("g", 5, {"w0", "w1"});
  EXPECT_EQ(directory.WorkerName("g", 5, 1), "w1");
  EXPECT_EQ(directory.WorkerName("g", 5, 2), "");
  EXPECT_EQ(directory.WorkerName("g", 5, -1), "");
  EXPECT_EQ(directory.WorkerName("g", 6, 0), "");
  EXPECT_EQ(directory.WorkerName("other", 5, 0), "");
}

TEST(PeerDirectoryTest, WaitFor_PartialEpochRankNotFetched_ResolverLearnsIt) {
  PeerDirectory directory;
  directory.LearnPartial("g", 5, 3, {1, "w1", "10.0.0.1:7"});
  EXPECT_EQ(directory.Check("g", 5, 1, "w1"), Verdict::kMember);
  EXPECT_EQ(directory.Address("g", 5, 1), "10.0.0.1:7");
  EXPECT_EQ(directory.Check("g", 5, 2, "w2"), Verdict::kUnknown);
  EXPECT_EQ(directory.Check("g", 5, 3, "w2"), Verdict::kNotMember);
  EXPECT_EQ(directory.Address("g", 5, 2), "");
  int asked_self = -1;
  int asked_rank = -1;
  directory.SetResolver(
      [&](const std::string& group, uint64_t epoch, int self, int rank) {
        asked_self = self;
        asked_rank = rank;
        directory.LearnRanks(group, epoch, {{rank, "w2", "10.0.0.2:7"}});
      });
  Verdict verdict = Verdict::kMember;
  std::optional<Verdict> answered;
  const uint64_t token = directory.WaitFor("g", 5, 2, "w9", &verdict,
                                           [&](Verdict v) { answered = v; });
  EXPECT_NE(token, 0u);
  EXPECT_EQ(verdict, Verdict::kUnknown);
  EXPECT_EQ(asked_self, 1);
  EXPECT_EQ(asked_rank, 2);
  EXPECT_EQ(answered, Verdict::kNotMember);
  EXPECT_EQ(directory.Check("g", 5, 2, "w2"), Verdict::kMember);
  EXPECT_EQ(directory.Address("g", 5, 2), "10.0.0.2:7");
  // Rank 0 still waits for a fetch; a full epoch never asks.
  EXPECT_EQ(directory.Check("g", 5, 0, "w0"), Verdict::kUnknown);
  asked_rank = -1;
  directory.Learn("h", 1, {"w0"});
  EXPECT_EQ(directory.WaitFor("h", 1, 0, "w1", &verdict, [](Verdict) {}), 0u);
  EXPECT_EQ(asked_rank, -1);
}

TEST(PeerDirectoryTest, LearnRanks_EpochNotRememberedOrFull_Ignored) {
  PeerDirectory directory;
  directory.LearnRanks("g", 5, {{0, "w0", "a:1"}});
  EXPECT_EQ(directory.Check("g", 5, 0, "w0"), Verdict::kUnknown);
  directory.Learn("g", 5, {"w0"});
  directory.LearnRanks("g", 5, {{0, "w9", "a:1"}});
  EXPECT_EQ(directory.Check("g", 5, 0, "w0"), Verdict::kMember);
  EXPECT_EQ(directory.Address("g", 5, 0), "");
}

}  // namespace
}  // namespace chorus
