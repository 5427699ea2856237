// Recursive doubling (RunRecursiveDoubling) for all_reduce, every rank a
// thread of this test over InProcessTransport: world sizes 1 to 8 (the
// ranks beyond a power of two fold into a partner), element counts 0, 1,
// odd and many chunks, f32, f16 and bf16 (accumulated in f32), f64 and
// integer types under every op, against the naive reference; a lost peer;
// and the refusal of other kinds.
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/in_process_group.h"

namespace chorus::test {
namespace {

using ::testing::AnyOf;
using ::testing::HasSubstr;

class RecursiveDoublingTest : public ::testing::TestWithParam<int> {};

TEST_P(RecursiveDoublingTest, EveryCountTypeAndOp_MatchesReferenceOnEveryRank) {
  const int world = GetParam();
  uint64_t seed = 1;
  for (uint64_t count : {0, 1, 7, 300}) {
    for (uint64_t chunk : {48, 50}) {
      for (DType dtype : AllDTypes()) {
        for (ReduceOp op : AllReduceOps()) {
          CollectiveCase c;
          c.spec = Spec(CollectiveKind::kAllReduce, dtype, count, op);
          c.algorithm = Algorithm::kRecursiveDoubling;
          c.seed = seed++;
          c.values = IsFloatDType(dtype) && op != ReduceOp::kSum &&
                             op != ReduceOp::kMin && op != ReduceOp::kMax
                         ? Values::kRounding
                         : Values::kExact;
          ASSERT_TRUE(RunAndCheckInProcess(RecursiveDoublingFn(), c, world,
                                           Algorithm::kRecursiveDoubling,
                                           chunk));
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Worlds, RecursiveDoublingTest, ::testing::Range(1, 9),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return absl::StrCat("world", info.param);
                         });

// Recursive doubling with its output place (AlgorithmArgs::output_place)
// `shift` elements into a buffer that holds its input (0: the input
// itself), as an in-place call on a caller's memory: the result lands in
// the place and not in the string.
AlgorithmFn IntoPlaceFn(uint64_t shift) {
  return [shift](const AlgorithmArgs& args, Algorithm* ran) -> absl::Status {
    const uint64_t offset = shift * DTypeSize(args.spec.dtype);
    std::string buffer(args.input);
    buffer.append(offset, '\0');
    AlgorithmArgs into_place = args;
    into_place.input = absl::string_view(buffer.data(), args.input.size());
    into_place.output_place = buffer.data() + offset;
    return RunWritingPlace(RecursiveDoublingFn(), into_place,
                           absl::string_view(buffer).substr(offset), ran);
  };
}

TEST(RecursiveDoublingPlaceTest, PlaceIsOrOverlapsTheInput_ResultThere) {
  for (uint64_t shift : {0, 1}) {
    for (int world : {1, 2, 3, 5}) {
      for (uint64_t count : {0, 1, 7, 300}) {
        for (DType dtype : {DType::kF32, DType::kI64}) {
          CollectiveCase c;
          c.spec =
              Spec(CollectiveKind::kAllReduce, dtype, count, ReduceOp::kSum);
          c.algorithm = Algorithm::kRecursiveDoubling;
          c.seed = count + 1;
          SCOPED_TRACE(absl::StrCat("shift ", shift));
          ASSERT_TRUE(RunAndCheckInProcess(IntoPlaceFn(shift), c, world,
                                           Algorithm::kRecursiveDoubling, 48));
        }
      }
    }
  }
}

TEST(RecursiveDoublingFailureTest, PeerLost_EveryOtherRankUnavailable) {
  // Rank 4 of 6 folds into rank 0 first; rank 0 then waits for it.
  InProcessHub hub("g", 6);
  hub.LosePeer(4);
  CollectiveCase c;
  c.spec = Spec(CollectiveKind::kAllReduce, DType::kF32, 100, ReduceOp::kSum);
  GroupRunOptions options;
  options.absent = {4};
  const std::vector<RankOutcome> outcomes =
      RunOnHub(hub, RecursiveDoublingFn(), c, options);
  for (int r : {0, 1, 2, 3, 5}) {
    EXPECT_EQ(outcomes[r].status.code(), absl::StatusCode::kUnavailable)
        << "rank " << r << ": " << outcomes[r].status;
    EXPECT_THAT(std::string(outcomes[r].status.message()),
                AnyOf("rank 4 of group g is gone: its data-plane stream from "
                      "in-process rank 4 broke",
                      "rank 4 of group g unreachable: data-plane connection to "
                      "in-process rank 4 failed: in-process rank 4 is lost"));
  }
}

TEST(RecursiveDoublingFailureTest, OtherKind_InvalidArgument) {
  InProcessHub hub("g", 2);
  CollectiveCase c;
  c.spec = Spec(CollectiveKind::kAllGather, DType::kF32, 4);
  const std::vector<RankOutcome> outcomes =
      RunOnHub(hub, RecursiveDoublingFn(), c);
  for (const RankOutcome& o : outcomes) {
    EXPECT_EQ(o.status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(o.status.message()),
                HasSubstr("recursive doubling runs all_reduce only"));
  }
}

}  // namespace
}  // namespace chorus::test
