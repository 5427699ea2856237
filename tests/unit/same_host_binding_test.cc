// Same-host all-reduces repeated on a binding (RunBoundSameHost), every
// rank a thread of this test over InProcessTransport: the binding comes from
// a same_host call (RunSameHost with AlgorithmArgs::bind_same_host) as in a
// worker; then calls that agree run on it, and a call that differs, a rank
// that comes late or never, or one that withdraws sends every rank to the
// coordinator; a lost peer is the transport's error. SameHostBindings keeps
// one binding per group epoch and rank.
#include "server/worker/algorithms/same_host_binding.h"

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/worker/algorithms/algorithm.h"
#include "server/worker/dataplane/in_process_transport.h"
#include "tests/testing/collective_reference.h"

namespace chorus::test {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kCount = 70000;  // i64: 560,000 bytes, several pieces
constexpr absl::Duration kLong = absl::Seconds(60);

CollectiveSpec SumSpec(uint64_t count = kCount) {
  return Spec(CollectiveKind::kAllReduce, DType::kI64, count, ReduceOp::kSum);
}

// Rank r's input for call `sequence`: element i is r * 1000 + i + sequence.
std::string InputOf(int rank, uint64_t sequence, uint64_t count = kCount) {
  std::vector<int64_t> values(count);
  for (uint64_t i = 0; i < count; ++i) {
    values[i] = rank * 1000 + static_cast<int64_t>(i + sequence);
  }
  return std::string(reinterpret_cast<const char*>(values.data()),
                     count * sizeof(int64_t));
}

std::string SumOf(int world, uint64_t sequence) {
  std::vector<int64_t> values(kCount, 0);
  for (int r = 0; r < world; ++r) {
    for (uint64_t i = 0; i < kCount; ++i) {
      values[i] += r * 1000 + static_cast<int64_t>(i + sequence);
    }
  }
  return std::string(reinterpret_cast<const char*>(values.data()),
                     kCount * sizeof(int64_t));
}

// Runs a same_host call (sequence 1) on every rank of `hub` and returns
// each rank's binding, holding the call's shape.
std::vector<std::shared_ptr<SameHostBinding>> Bind(InProcessHub& hub) {
  const int world = hub.world_size();
  std::vector<std::shared_ptr<SameHostBinding>> bindings(world);
  RunOnRanks(world, [&](int rank) {
    InProcessTransport transport(&hub, rank, 1, absl::Now() + kLong);
    const std::string input = InputOf(rank, 1);
    std::string output;
    AlgorithmArgs args;
    args.spec = SumSpec();
    args.input = input;
    args.output = &output;
    args.transport = &transport;
    args.bind_same_host = &bindings[rank];
    ASSERT_TRUE(RunSameHost(args).ok());
    ASSERT_EQ(output, SumOf(world, 1));
  });
  for (const auto& binding : bindings) {
    EXPECT_NE(binding, nullptr);
    if (binding != nullptr) binding->AddShape(SumSpec());
  }
  return bindings;
}

struct Outcome {
  absl::StatusOr<BoundEnd> end = absl::UnknownError("not run");
  std::string output;
  absl::Duration took;
};

// Runs call `sequence` of `spec` on `binding` for `rank` with `patience`.
Outcome CallBound(InProcessHub& hub, SameHostBinding& binding, int rank,
                  uint64_t sequence, const CollectiveSpec& spec,
                  absl::Duration patience) {
  const absl::Time start = absl::Now();
  InProcessTransport patient(&hub, rank, sequence, start + patience);
  InProcessTransport transport(&hub, rank, sequence, start + kLong);
  const std::string input = InputOf(rank, sequence, spec.count);
  Outcome outcome;
  BoundCallArgs args;
  args.sequence = sequence;
  args.spec = spec;
  args.input = input;
  args.output = &outcome.output;
  args.patience = &patient;
  args.transport = &transport;
  outcome.end = RunBoundSameHost(binding, args);
  outcome.took = absl::Now() - start;
  return outcome;
}

TEST(SameHostBindingTest, RunBoundSameHost_EveryRankAgrees_SumsEveryCall) {
  for (int world : {2, 3, 4}) {
    InProcessHub hub("bound", world);
    std::vector<std::shared_ptr<SameHostBinding>> bindings = Bind(hub);
    ASSERT_EQ(bindings.size(), static_cast<size_t>(world));
    for (uint64_t sequence = 2; sequence < 7; ++sequence) {
      RunOnRanks(world, [&](int rank) {
        Outcome got =
            CallBound(hub, *bindings[rank], rank, sequence, SumSpec(), kLong);
        ASSERT_TRUE(got.end.ok()) << got.end.status();
        EXPECT_EQ(*got.end, BoundEnd::kDone);
        EXPECT_TRUE(got.output == SumOf(world, sequence))
            << "world " << world << " rank " << rank << " call " << sequence;
      });
    }
  }
}

TEST(SameHostBindingTest, RunBoundSameHost_OutputPlaceOverInput_SumsThere) {
  InProcessHub hub("bound", 3);
  std::vector<std::shared_ptr<SameHostBinding>> bindings = Bind(hub);
  RunOnRanks(3, [&](int rank) {
    InProcessTransport transport(&hub, rank, 2, absl::Now() + kLong);
    std::string place = InputOf(rank, 2);
    std::string untouched;
    BoundCallArgs args;
    args.sequence = 2;
    args.spec = SumSpec();
    args.input = place;
    args.output = &untouched;
    args.output_place = place.data();
    args.patience = &transport;
    args.transport = &transport;
    absl::StatusOr<BoundEnd> end = RunBoundSameHost(*bindings[rank], args);
    ASSERT_TRUE(end.ok()) << end.status();
    EXPECT_EQ(*end, BoundEnd::kDone);
    EXPECT_TRUE(place == SumOf(3, 2));
    EXPECT_TRUE(untouched.empty());
  });
}

TEST(SameHostBindingTest,
     RunBoundSameHost_CallsDiffer_EveryRankAsksCoordinator) {
  InProcessHub hub("bound", 3);
  std::vector<std::shared_ptr<SameHostBinding>> bindings = Bind(hub);
  RunOnRanks(3, [&](int rank) {
    const CollectiveSpec spec = SumSpec(rank == 2 ? kCount - 1 : kCount);
    Outcome got = CallBound(hub, *bindings[rank], rank, 2, spec, kLong);
    ASSERT_TRUE(got.end.ok()) << got.end.status();
    EXPECT_EQ(*got.end, BoundEnd::kAskCoordinator) << "rank " << rank;
    EXPECT_TRUE(got.output.empty());
  });
  // The binding serves the next call that agrees.
  RunOnRanks(3, [&](int rank) {
    Outcome got = CallBound(hub, *bindings[rank], rank, 3, SumSpec(), kLong);
    ASSERT_TRUE(got.end.ok()) << got.end.status();
    EXPECT_EQ(*got.end, BoundEnd::kDone);
    EXPECT_TRUE(got.output == SumOf(3, 3));
  });
}

TEST(SameHostBindingTest,
     RunBoundSameHost_RankNeverCalls_OthersAskCoordinatorAtPatience) {
  InProcessHub hub("bound", 3);
  std::vector<std::shared_ptr<SameHostBinding>> bindings = Bind(hub);
  const absl::Duration patience = absl::Milliseconds(100);
  RunOnRanks(2, [&](int rank) {
    Outcome got = CallBound(hub, *bindings[rank], rank, 2, SumSpec(), patience);
    ASSERT_TRUE(got.end.ok()) << got.end.status();
    EXPECT_EQ(*got.end, BoundEnd::kAskCoordinator);
    EXPECT_GE(got.took, patience);
  });
  // Late, rank 2 sees that they withdrew and goes there too, at once.
  Outcome late = CallBound(hub, *bindings[2], 2, 2, SumSpec(), kLong);
  ASSERT_TRUE(late.end.ok()) << late.end.status();
  EXPECT_EQ(*late.end, BoundEnd::kAskCoordinator);
  EXPECT_LT(late.took, kLong / 2);
}

TEST(SameHostBindingTest, WithdrawBound_RankGoesElsewhere_OthersAskAtOnce) {
  InProcessHub hub("bound", 3);
  std::vector<std::shared_ptr<SameHostBinding>> bindings = Bind(hub);
  WithdrawBound(*bindings[1], 2);
  RunOnRanks(3, [&](int rank) {
    if (rank == 1) return;
    Outcome got = CallBound(hub, *bindings[rank], rank, 2, SumSpec(), kLong);
    ASSERT_TRUE(got.end.ok()) << got.end.status();
    EXPECT_EQ(*got.end, BoundEnd::kAskCoordinator);
    EXPECT_LT(got.took, kLong / 2);
  });
}

TEST(SameHostBindingTest, RunBoundSameHost_PeerLost_ReturnsTransportError) {
  InProcessHub hub("bound", 3);
  std::vector<std::shared_ptr<SameHostBinding>> bindings = Bind(hub);
  hub.LosePeer(2);
  std::vector<Outcome> got(2);
  RunOnRanks(2, [&](int rank) {
    got[rank] = CallBound(hub, *bindings[rank], rank, 2, SumSpec(), kLong);
  });
  // A rank sees the loss; the other sees it too, or that rank withdraw
  // first (and then asks the coordinator, which has the failure report).
  int lost = 0;
  for (const Outcome& outcome : got) {
    if (outcome.end.ok()) {
      EXPECT_EQ(*outcome.end, BoundEnd::kAskCoordinator);
      continue;
    }
    ++lost;
    EXPECT_EQ(outcome.end.status().code(), absl::StatusCode::kUnavailable);
    EXPECT_THAT(outcome.end.status().message(), HasSubstr("rank 2"));
  }
  EXPECT_GE(lost, 1);
}

TEST(SameHostBindingTest,
     RunBoundSameHost_CallBehindALaterOne_AsksCoordinator) {
  InProcessHub hub("bound", 2);
  std::vector<std::shared_ptr<SameHostBinding>> bindings = Bind(hub);
  RunOnRanks(2, [&](int rank) {
    Outcome got = CallBound(hub, *bindings[rank], rank, 5, SumSpec(), kLong);
    ASSERT_TRUE(got.end.ok()) << got.end.status();
    EXPECT_EQ(*got.end, BoundEnd::kDone);
  });
  // Call 4 came after call 5 ran: it cannot run on the binding any more.
  Outcome behind = CallBound(hub, *bindings[0], 0, 4, SumSpec(), kLong);
  ASSERT_TRUE(behind.end.ok()) << behind.end.status();
  EXPECT_EQ(*behind.end, BoundEnd::kAskCoordinator);
  EXPECT_LT(behind.took, kLong / 2);
}

TEST(SameHostBindingTest, Fits_ShapesAddedAndCarried_OnlyThoseThatFit) {
  InProcessHub hub("bound", 2);
  std::vector<std::shared_ptr<SameHostBinding>> first = Bind(hub);
  EXPECT_TRUE(first[0]->Fits(SumSpec()));
  EXPECT_FALSE(first[0]->Fits(SumSpec(kCount - 1)));
  CollectiveSpec other = SumSpec();
  other.op = ReduceOp::kMax;
  EXPECT_FALSE(first[0]->Fits(other));
  first[0]->AddShape(other);
  EXPECT_TRUE(first[0]->Fits(other));
  const CollectiveSpec huge = SumSpec(first[0]->capacity());
  first[0]->AddShape(huge);
  EXPECT_FALSE(first[0]->Fits(huge));

  SameHostBindings kept;
  kept.Keep("g", 1, 0, first[0]);
  EXPECT_EQ(kept.Find("g", 1, 0), first[0]);
  EXPECT_EQ(kept.Find("g", 1, 1), nullptr);
  EXPECT_EQ(kept.Find("g", 2, 0), nullptr);
  // A newer binding of the rank takes over its shapes.
  InProcessHub again("bound-again", 2);
  std::vector<std::shared_ptr<SameHostBinding>> second = Bind(again);
  kept.Keep("g", 1, 0, second[0]);
  EXPECT_EQ(kept.Find("g", 1, 0), second[0]);
  EXPECT_TRUE(second[0]->Fits(other));
  // A newer epoch's replaces it; dropping the epoch forgets it.
  kept.Keep("g", 2, 0, first[1]);
  EXPECT_EQ(kept.Find("g", 1, 0), nullptr);
  kept.Drop("g", 2);
  EXPECT_EQ(kept.Find("g", 2, 0), nullptr);
}

}  // namespace
}  // namespace chorus::test
