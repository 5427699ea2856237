// The ring (RunRing) for every collective kind except barrier, with every
// rank of the group a thread of this test over InProcessTransport: world
// sizes 1 to 8, element counts 0, 1, an odd count and one of many chunks
// (with chunks that are not a whole number of elements too), reducing kinds
// in f32, f16 and bf16 (accumulated in f32), f64, integer types and every
// op, checked against the naive reference; and what ranks get when a peer
// is lost, misses the deadline or the group is aborted.
#include <algorithm>
#include <cstring>
#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/worker/algorithms/algorithm.h"
#include "tests/testing/in_process_group.h"

namespace chorus::test {
namespace {

using ::testing::AnyOf;
using ::testing::MatchesRegex;

struct TypedOp {
  DType dtype;
  ReduceOp op;
};

// (dtype, op) pairs for kinds that reduce: every op, every 16-bit float.
std::vector<TypedOp> ReducingTypes() {
  return {{DType::kF32, ReduceOp::kSum},  {DType::kF16, ReduceOp::kSum},
          {DType::kBF16, ReduceOp::kSum}, {DType::kBF16, ReduceOp::kAvg},
          {DType::kF64, ReduceOp::kMin},  {DType::kI32, ReduceOp::kSum},
          {DType::kI8, ReduceOp::kProd},  {DType::kU64, ReduceOp::kMax},
          {DType::kI64, ReduceOp::kAvg},  {DType::kF32, ReduceOp::kProd}};
}

// Element types for kinds that move data: 2, 4, 8 and 1 bytes.
std::vector<DType> MovingTypes() {
  return {DType::kF16, DType::kF32, DType::kU64, DType::kI8};
}

// Counts 0, 1, odd, and many chunks of the chunk sizes below.
const uint64_t kCounts[] = {0, 1, 7, 300};
// A chunk of 48 bytes (whole elements of every type), and one of 50, which
// the algorithms round down to whole elements.
const uint64_t kChunks[] = {48, 50};

using Param = std::tuple<int, CollectiveKind>;

class RingTest : public ::testing::TestWithParam<Param> {};

TEST_P(RingTest, EveryCountAndType_MatchesReferenceOnEveryRank) {
  const auto [world, kind] = GetParam();
  uint64_t seed = 1;
  for (uint64_t count : kCounts) {
    for (uint64_t chunk : kChunks) {
      std::vector<CollectiveSpec> specs;
      const int root = static_cast<int>((count + chunk) % world);
      if (KindReduces(kind)) {
        for (const TypedOp& t : ReducingTypes()) {
          specs.push_back(Spec(kind, t.dtype, count, t.op, root));
        }
      } else {
        for (DType dtype : MovingTypes()) {
          specs.push_back(
              Spec(kind, dtype, count, ReduceOp::kUnspecified, root));
        }
      }
      for (const CollectiveSpec& spec : specs) {
        CollectiveCase c;
        c.spec = spec;
        c.algorithm = Algorithm::kRing;
        c.seed = seed++;
        ASSERT_TRUE(
            RunAndCheckInProcess(RingFn(), c, world, Algorithm::kRing, chunk));
        // Full-precision floats: rounding within the reference's bound.
        if (IsFloatDType(spec.dtype) && KindReduces(kind)) {
          c.values = Values::kRounding;
          ASSERT_TRUE(RunAndCheckInProcess(RingFn(), c, world, Algorithm::kRing,
                                           chunk));
        }
      }
    }
  }
}

std::string ParamName(const ::testing::TestParamInfo<Param>& info) {
  return absl::StrCat("world", std::get<0>(info.param), "_",
                      CollectiveKindName(std::get<1>(info.param)));
}

INSTANTIATE_TEST_SUITE_P(
    Worlds, RingTest,
    ::testing::Combine(::testing::Range(1, 9),
                       ::testing::Values(CollectiveKind::kAllReduce,
                                         CollectiveKind::kReduce,
                                         CollectiveKind::kBroadcast,
                                         CollectiveKind::kAllGather,
                                         CollectiveKind::kReduceScatter,
                                         CollectiveKind::kGather,
                                         CollectiveKind::kScatter,
                                         CollectiveKind::kAllToAll)),
    ParamName);

CollectiveCase AllReduceCase(uint64_t count) {
  CollectiveCase c;
  c.spec = Spec(CollectiveKind::kAllReduce, DType::kF32, count, ReduceOp::kSum);
  c.algorithm = Algorithm::kRing;
  return c;
}

// Runs a ring all-reduce of `c` on `world` ranks whose output strings
// start as `start(rank, input)`, with the input read from the output
// string itself when `in_place`; returns each rank's output.
std::vector<std::string> RingAllReduceFrom(
    const CollectiveCase& c, int world, bool in_place,
    const std::function<std::string(int, const std::string&)>& start) {
  InProcessHub hub("g", world);
  std::vector<std::string> outputs(world);
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  RunOnRanks(world, [&](int rank) {
    const std::string input = MakeInput(c, world, rank);
    outputs[rank] = start(rank, input);
    InProcessTransport transport(&hub, rank, 1, deadline);
    AlgorithmArgs args;
    args.spec = c.spec;
    args.chunk_bytes = 64;
    args.input = in_place ? absl::string_view(outputs[rank]) : input;
    args.output = &outputs[rank];
    args.transport = &transport;
    EXPECT_TRUE(RunRing(args).ok()) << "rank " << rank;
  });
  return outputs;
}

TEST(RingAllReduceTest, InputIsTheOutputItself_SameAsOutOfPlace) {
  const CollectiveCase c = AllReduceCase(1001);
  const auto fresh = [](int, const std::string&) { return std::string(); };
  const auto copy = [](int, const std::string& input) { return input; };
  const std::vector<std::string> expected =
      RingAllReduceFrom(c, 3, /*in_place=*/false, fresh);
  EXPECT_EQ(RingAllReduceFrom(c, 3, /*in_place=*/true, copy), expected);
}

TEST(RingAllReduceTest, OutputHeldOtherBytes_Overwritten) {
  const CollectiveCase c = AllReduceCase(1001);
  const auto fresh = [](int, const std::string&) { return std::string(); };
  // Longer, shorter and equally long garbage.
  const auto garbage = [](int rank, const std::string& input) {
    return std::string(input.size() + (rank - 1) * 40, '\x7f');
  };
  const std::vector<std::string> expected =
      RingAllReduceFrom(c, 3, /*in_place=*/false, fresh);
  EXPECT_EQ(RingAllReduceFrom(c, 3, /*in_place=*/false, garbage), expected);
  for (int world : {1, 2}) {
    const std::vector<std::string> outputs =
        RingAllReduceFrom(c, world, /*in_place=*/false, garbage);
    std::vector<std::string> inputs(world);
    for (int r = 0; r < world; ++r) inputs[r] = MakeInput(c, world, r);
    const std::vector<Expected> want = Reference(c, world, inputs);
    for (int r = 0; r < world; ++r) {
      EXPECT_TRUE(MatchesExpected(c, want[r], outputs[r]))
          << "world " << world << ", rank " << r;
    }
  }
}

// What one rank of RingAllReduceInPlace left: its place and its string.
struct PlaceAndString {
  std::string place;
  std::string string;
};

// Runs `c` under the ring on `world` ranks, each with an output place
// (AlgorithmArgs::output_place) `offset` bytes into a buffer of its own,
// first 0x7f bytes; when `in_place`, the input is copied into the buffer
// and read from there, from the place's start (at the rank's block for
// all_gather and gather, as torch's all_gather_into_tensor does), as an
// in-place call on a caller's memory.
std::vector<PlaceAndString> RingIntoPlace(const CollectiveCase& c, int world,
                                          uint64_t offset, bool in_place) {
  InProcessHub hub("g", world);
  std::vector<PlaceAndString> left(world);
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  RunOnRanks(world, [&](int rank) {
    const std::string input = MakeInput(c, world, rank);
    const uint64_t bytes = OutputBytes(c.spec, world, rank);
    const bool at_block = c.spec.kind == CollectiveKind::kAllGather ||
                          c.spec.kind == CollectiveKind::kGather;
    const uint64_t input_at = at_block ? rank * input.size() : 0;
    std::string buffer(offset + std::max(bytes, input_at + input.size()),
                       '\x7f');
    char* place = buffer.data() + offset;
    char* input_place = place + input_at;
    if (in_place && !input.empty()) {
      std::memcpy(input_place, input.data(), input.size());
    }
    InProcessTransport transport(&hub, rank, 1, deadline);
    AlgorithmArgs args;
    args.spec = c.spec;
    args.chunk_bytes = 64;
    args.input =
        in_place ? absl::string_view(input_place, input.size()) : input;
    args.output = &left[rank].string;
    args.output_place = place;
    args.transport = &transport;
    const absl::Status status = RunRing(args);
    EXPECT_TRUE(status.ok()) << "rank " << rank << ": " << status;
    left[rank].place = buffer.substr(offset, bytes);
  });
  return left;
}

// Runs `kind` of `dtype` (sum, root the last rank) under the ring into
// places (RingIntoPlace) and expects each rank's result in its place and
// its string untouched.
void ExpectResultsInPlaces(CollectiveKind kind, DType dtype, int world,
                           uint64_t offset, bool in_place) {
  CollectiveCase c;
  c.spec = Spec(kind, dtype, 333, ReduceOp::kSum);
  c.spec.root = world - 1;
  c.algorithm = Algorithm::kRing;
  std::vector<std::string> inputs(world);
  for (int r = 0; r < world; ++r) inputs[r] = MakeInput(c, world, r);
  const std::vector<Expected> want = Reference(c, world, inputs);
  const std::vector<PlaceAndString> left =
      RingIntoPlace(c, world, offset, in_place);
  for (int r = 0; r < world; ++r) {
    SCOPED_TRACE(absl::StrCat(CollectiveKindName(kind), " ", DTypeName(dtype),
                              " in place ", in_place, ", world ", world,
                              ", rank ", r));
    EXPECT_TRUE(MatchesExpected(c, want[r], left[r].place));
    EXPECT_TRUE(left[r].string.empty());
  }
}

TEST(RingIntoPlaceTest, EveryKindWithAPlace_WrittenInThePlaceOnly) {
  for (CollectiveKind kind :
       {CollectiveKind::kAllGather, CollectiveKind::kBroadcast,
        CollectiveKind::kReduceScatter, CollectiveKind::kReduce,
        CollectiveKind::kGather}) {
    for (bool in_place : {false, true}) {
      for (int world : {1, 2, 3, 4}) {
        ExpectResultsInPlaces(kind, DType::kI32, world, /*offset=*/3, in_place);
      }
    }
  }
}

TEST(RingAllReduceTest, OutputPlaceOverItsInput_WrittenThereNotInTheString) {
  const CollectiveCase c = AllReduceCase(1001);
  const auto fresh = [](int, const std::string&) { return std::string(); };
  for (int world : {1, 2, 3, 4}) {
    const std::vector<std::string> expected =
        RingAllReduceFrom(c, world, /*in_place=*/false, fresh);
    const std::vector<PlaceAndString> left =
        RingIntoPlace(c, world, /*offset=*/16, /*in_place=*/true);
    for (int r = 0; r < world; ++r) {
      EXPECT_EQ(left[r].place, expected[r]) << "world " << world << ", " << r;
      EXPECT_TRUE(left[r].string.empty()) << "world " << world << ", " << r;
    }
  }
}

TEST(RingAllReduceTest, OutputPlaceMisalignedForTheDtype_StringWritten) {
  // A place for 1001 f32 at an address 2 bytes past an f32 boundary: the
  // ring reduces in the string and leaves the place as it was.
  const CollectiveCase c = AllReduceCase(1001);
  const auto fresh = [](int, const std::string&) { return std::string(); };
  const std::vector<std::string> expected =
      RingAllReduceFrom(c, 3, /*in_place=*/false, fresh);
  const std::vector<PlaceAndString> left =
      RingIntoPlace(c, 3, /*offset=*/18, /*in_place=*/false);
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(left[r].string, expected[r]) << "rank " << r;
    EXPECT_EQ(left[r].place, std::string(expected[r].size(), '\x7f'))
        << "rank " << r;
  }
}

TEST(RingAllReduceTest, OutputPlaceOverlapsPartOfItsInput_StringWritten) {
  // The place starts one f32 into the input: the ring reduces in the
  // string, reading the input as given, and leaves the place alone.
  const CollectiveCase c = AllReduceCase(1001);
  const auto fresh = [](int, const std::string&) { return std::string(); };
  const std::vector<std::string> expected =
      RingAllReduceFrom(c, 3, /*in_place=*/false, fresh);
  InProcessHub hub("g", 3);
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  RunOnRanks(3, [&](int rank) {
    std::string buffer = MakeInput(c, 3, rank) + std::string(4, '\0');
    const std::string before = buffer;
    InProcessTransport transport(&hub, rank, 1, deadline);
    AlgorithmArgs args;
    args.spec = c.spec;
    args.chunk_bytes = 64;
    args.input = absl::string_view(buffer.data(), buffer.size() - 4);
    std::string output;
    args.output = &output;
    args.output_place = buffer.data() + 4;
    args.transport = &transport;
    const absl::Status status = RunRing(args);
    EXPECT_TRUE(status.ok()) << "rank " << rank << ": " << status;
    EXPECT_EQ(output, expected[rank]) << "rank " << rank;
    EXPECT_EQ(buffer, before) << "rank " << rank;
  });
}

TEST(RingIntoPlaceTest, WidenedReductions_WrittenInThePlaceOnly) {
  // f16 and bf16 reduce in f32: the input is widened before the place,
  // which may be the input itself, is written (an input is read at an
  // address its dtype suits).
  for (CollectiveKind kind :
       {CollectiveKind::kAllReduce, CollectiveKind::kReduceScatter,
        CollectiveKind::kReduce}) {
    for (DType dtype : {DType::kF16, DType::kBF16}) {
      for (bool in_place : {false, true}) {
        for (int world : {1, 2, 3}) {
          ExpectResultsInPlaces(kind, dtype, world, /*offset=*/2, in_place);
        }
      }
    }
  }
}

TEST(RingFailureTest, PeerLost_EveryOtherRankUnavailableNamingIt) {
  InProcessHub hub("g", 4);
  hub.LosePeer(2);
  GroupRunOptions options;
  options.chunk_bytes = 64;
  options.absent = {2};
  const std::vector<RankOutcome> outcomes =
      RunOnHub(hub, RingFn(), AllReduceCase(1000), options);
  for (int r : {0, 1, 3}) {
    EXPECT_EQ(outcomes[r].status.code(), absl::StatusCode::kUnavailable)
        << "rank " << r << ": " << outcomes[r].status;
    // A rank sending to the lost one learns it there; the others wait for
    // data and learn that its stream broke, as between workers.
    EXPECT_THAT(std::string(outcomes[r].status.message()),
                AnyOf("rank 2 of group g is gone: its data-plane stream from "
                      "in-process rank 2 broke",
                      "rank 2 of group g unreachable: data-plane connection to "
                      "in-process rank 2 failed: in-process rank 2 is lost"))
        << "rank " << r;
  }
}

TEST(RingFailureTest, RankNeverComes_OthersDeadlineExceededNamingASender) {
  InProcessHub hub("g", 3);
  GroupRunOptions options;
  options.timeout = absl::Milliseconds(200);
  options.absent = {1};
  const std::vector<RankOutcome> outcomes =
      RunOnHub(hub, RingFn(), AllReduceCase(100), options);
  for (int r : {0, 2}) {
    EXPECT_EQ(outcomes[r].status.code(), absl::StatusCode::kDeadlineExceeded)
        << outcomes[r].status;
    EXPECT_THAT(std::string(outcomes[r].status.message()),
                MatchesRegex("rank [0-2] of group g sent no data for "
                             "collective #1 within the deadline"));
  }
}

TEST(RingFailureTest, GroupAborted_EveryWaitingRankGetsTheVerdict) {
  InProcessHub hub("g", 3);
  const absl::Status verdict = absl::AbortedError("rank 1 of group g is lost");
  hub.Abort(verdict);
  GroupRunOptions options;
  options.absent = {1};
  const std::vector<RankOutcome> outcomes =
      RunOnHub(hub, RingFn(), AllReduceCase(100), options);
  EXPECT_EQ(outcomes[0].status, verdict);
  EXPECT_EQ(outcomes[2].status, verdict);
}

}  // namespace
}  // namespace chorus::test
