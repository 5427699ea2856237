// The same_host plan (RunSameHost) for all_reduce, every rank a thread of
// this test over InProcessTransport. It runs in one process as between
// processes: each rank's segment is a memfd of its own, which the other
// ranks map through /proc/<pid>/fd/<fd> (here the test's own pid). World
// sizes 1 to 8, element counts 0, 1, odd, and more than one reduce piece
// (256 KiB), every dtype (16-bit floats accumulated in f32) and op, against
// the naive reference; a lost peer; the refusal of other kinds; the
// fallback to the ring when one rank reduced in place and a peer could not
// map its segment. The fallback across pid namespaces needs separate
// processes and is tested in tests/integration/same_host_fallback_test.cc.
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/worker/dataplane/transport.h"
#include "tests/testing/in_process_group.h"

namespace chorus::test {
namespace {

using ::testing::AnyOf;
using ::testing::HasSubstr;

class SameHostTest : public ::testing::TestWithParam<int> {};

TEST_P(SameHostTest, EveryCountTypeAndOp_MatchesReferenceOnEveryRank) {
  const int world = GetParam();
  uint64_t seed = 1;
  for (uint64_t count : {0, 1, 7, 300}) {
    for (DType dtype : AllDTypes()) {
      for (ReduceOp op : AllReduceOps()) {
        CollectiveCase c;
        c.spec = Spec(CollectiveKind::kAllReduce, dtype, count, op);
        c.algorithm = Algorithm::kSameHost;
        c.seed = seed++;
        c.values = IsFloatDType(dtype) && op != ReduceOp::kSum &&
                           op != ReduceOp::kMin && op != ReduceOp::kMax
                       ? Values::kRounding
                       : Values::kExact;
        ASSERT_TRUE(RunAndCheckInProcess(SameHostFn(), c, world,
                                         Algorithm::kSameHost, 1 << 20));
      }
    }
  }
}

TEST_P(SameHostTest, ManyReducePieces_MatchesReferenceOnEveryRank) {
  const int world = GetParam();
  // 3 MiB of f32 and of f16: blocks of several 256 KiB pieces at any world.
  for (DType dtype : {DType::kF32, DType::kF16}) {
    CollectiveCase c;
    c.spec =
        Spec(CollectiveKind::kAllReduce, dtype, 3 << 20 >> 2, ReduceOp::kSum);
    c.algorithm = Algorithm::kSameHost;
    c.seed = 7;
    ASSERT_TRUE(RunAndCheckInProcess(SameHostFn(), c, world,
                                     Algorithm::kSameHost, 1 << 20));
  }
}

// The same_host plan writing into a place of its own (AlgorithmArgs::
// output_place) that is also its input, as a call on shared memory of an
// in-place all_reduce does: the result lands there and not in the string.
AlgorithmFn InPlaceSameHostFn() {
  return [](const AlgorithmArgs& args, Algorithm* ran) -> absl::Status {
    std::string place(args.input);
    AlgorithmArgs in_place = args;
    in_place.input = place;
    in_place.output_place = place.data();
    return RunWritingPlace(SameHostFn(), in_place, place, ran);
  };
}

TEST_P(SameHostTest, OutputPlaceOverItsInput_MatchesReferenceOnEveryRank) {
  const int world = GetParam();
  // 524301 f32 (2 MiB and 52 bytes): blocks of one or more 256 KiB
  // pieces, the last one short.
  for (uint64_t count : {0, 7, 70000, 524301}) {
    CollectiveCase c;
    c.spec =
        Spec(CollectiveKind::kAllReduce, DType::kF32, count, ReduceOp::kSum);
    c.algorithm = Algorithm::kSameHost;
    c.seed = 11;
    ASSERT_TRUE(RunAndCheckInProcess(InPlaceSameHostFn(), c, world,
                                     Algorithm::kSameHost, 1 << 20));
  }
}

// A transport whose rank's first message to each peer (step A's hello:
// pid, descriptor, segment id, ticket, 8 bytes each) names another segment
// id, so that no peer can map this rank's segment while this rank maps theirs.
class ForgedHelloTransport final : public Transport {
 public:
  explicit ForgedHelloTransport(Transport* inner)
      : inner_(inner), greeted_(inner->world_size(), false) {}
  int rank() const override { return inner_->rank(); }
  int world_size() const override { return inner_->world_size(); }
  absl::Status Send(int to, absl::string_view data) override {
    if (greeted_[to]) return inner_->Send(to, data);
    greeted_[to] = true;
    std::string forged(data);
    if (forged.size() == 32) forged[16] ^= 0x5a;  // the id's low byte
    return inner_->Send(to, forged);
  }
  absl::StatusOr<std::string> Recv(int from) override {
    return inner_->Recv(from);
  }
  absl::StatusOr<std::string> RecvBy(int from, absl::Time deadline) override {
    return inner_->RecvBy(from, deadline);
  }
  absl::Status AwaitWord(int from, const std::atomic<uint64_t>& word,
                         uint64_t target) override {
    return inner_->AwaitWord(from, word, target);
  }

 private:
  Transport* const inner_;
  std::vector<bool> greeted_;
};

TEST(SameHostFallbackTest, OneRankMappedAndReducedInPlace_RingOnTheInput) {
  // Rank 1 maps every segment and reduces its block (its output place is
  // its input); no other rank can map rank 1's segment, and each says so in
  // its stage. Every rank falls back to the ring (which writes the output
  // place too), rank 1 too, on its input, which the plan has not written.
  const AlgorithmFn fn = [](const AlgorithmArgs& args, Algorithm* ran) {
    std::string place(args.input);
    AlgorithmArgs in_place = args;
    in_place.input = place;
    in_place.output_place = place.data();
    ForgedHelloTransport forged(args.transport);
    if (args.transport->rank() == 1) in_place.transport = &forged;
    return RunWritingPlace(SameHostFn(), in_place, place, ran);
  };
  for (int world : {2, 3}) {
    CollectiveCase c;
    c.spec =
        Spec(CollectiveKind::kAllReduce, DType::kF32, 70000, ReduceOp::kSum);
    c.algorithm = Algorithm::kSameHost;
    c.seed = 13;
    ASSERT_TRUE(RunAndCheckInProcess(fn, c, world, Algorithm::kRing, 1 << 20));
  }
}

INSTANTIATE_TEST_SUITE_P(Worlds, SameHostTest, ::testing::Range(1, 9),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return absl::StrCat("world", info.param);
                         });

TEST(SameHostFailureTest, PeerLost_EveryOtherRankUnavailable) {
  InProcessHub hub("g", 3);
  hub.LosePeer(1);
  CollectiveCase c;
  c.spec = Spec(CollectiveKind::kAllReduce, DType::kF32, 100, ReduceOp::kSum);
  GroupRunOptions options;
  options.absent = {1};
  const std::vector<RankOutcome> outcomes =
      RunOnHub(hub, SameHostFn(), c, options);
  for (int r : {0, 2}) {
    EXPECT_EQ(outcomes[r].status.code(), absl::StatusCode::kUnavailable)
        << outcomes[r].status;
    EXPECT_THAT(std::string(outcomes[r].status.message()),
                AnyOf("rank 1 of group g is gone: its data-plane stream from "
                      "in-process rank 1 broke",
                      "rank 1 of group g unreachable: data-plane connection to "
                      "in-process rank 1 failed: in-process rank 1 is lost"));
  }
}

TEST(SameHostFailureTest, OtherKind_InvalidArgument) {
  InProcessHub hub("g", 2);
  CollectiveCase c;
  c.spec = Spec(CollectiveKind::kBroadcast, DType::kF32, 4);
  for (const RankOutcome& o : RunOnHub(hub, SameHostFn(), c)) {
    EXPECT_EQ(o.status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(o.status.message()),
                HasSubstr("the same_host plan runs all_reduce only"));
  }
}

}  // namespace
}  // namespace chorus::test
