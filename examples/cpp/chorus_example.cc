// A rank of a Chorus group in C++, built against an installed Chorus: it
// joins a group through its host's worker daemon, all-reduces, all-gathers
// asynchronously, then meets a typed error on purpose (every rank asks for
// a different size) and reads what each rank asked for from the status.
//
// Usage: chorus_example WORKER GROUP WORLD RANK
//   WORKER  the worker daemon's local API, e.g. unix:/run/chorus/worker.sock
//           (a worker's --local_socket) or 127.0.0.1:PORT
// Run one process per rank, all with the same GROUP and WORLD. Exits 0 when
// every step did what it should.
#include <chorus/communicator.h>
#include <chorus/status_facts.h>
#include <chorus/types.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace {

// Prints `what` failed with `status` and returns the exit code.
int Fail(const std::string& what, const absl::Status& status) {
  std::cerr << what << ": " << status << std::endl;
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5) {
    std::cerr << "usage: " << argv[0] << " WORKER GROUP WORLD RANK\n";
    return 2;
  }
  const std::string worker = argv[1];
  const std::string group = argv[2];
  const int world = std::atoi(argv[3]);
  const int rank = std::atoi(argv[4]);

  // Returns once every rank joined (or with a status naming who did not).
  chorus::JoinOptions join;
  join.timeout = absl::Seconds(30);
  absl::StatusOr<std::unique_ptr<chorus::Communicator>> joined =
      chorus::Communicator::JoinThroughDaemon(worker, group, world, rank, join);
  if (!joined.ok()) return Fail("join", joined.status());
  chorus::Communicator& comm = **joined;
  std::cout << "rank " << rank << " of " << world << " joined group " << group
            << " (epoch " << comm.epoch() << ")" << std::endl;

  // A blocking all-reduce: every rank gets the element-wise sum.
  std::vector<float> mine = {1.0f * (rank + 1), 10.0f * (rank + 1)};
  std::vector<float> sum;
  absl::Status reduced = comm.AllReduce(mine, &sum, chorus::ReduceOp::kSum);
  if (!reduced.ok()) return Fail("all_reduce", reduced);
  std::cout << "all_reduce sum: " << sum[0] << " " << sum[1] << std::endl;

  // An asynchronous all-gather: issued now, waited for later. Every rank
  // gets every rank's block, in rank order.
  chorus::CollectiveSpec gather;
  gather.kind = chorus::CollectiveKind::kAllGather;
  gather.dtype = chorus::DType::kI32;
  gather.count = 2;
  const int32_t block[2] = {rank, rank * rank};
  std::string gathered;
  chorus::CollectiveHandle pending = comm.RunAsync(
      gather, std::string(reinterpret_cast<const char*>(block), sizeof(block)),
      &gathered);
  absl::StatusOr<chorus::CallResult> done = pending.Wait();
  if (!done.ok()) return Fail("all_gather", done.status());
  std::vector<int32_t> blocks(gathered.size() / sizeof(int32_t));
  std::memcpy(blocks.data(), gathered.data(), gathered.size());
  std::cout << "all_gather (asynchronous, #" << done->sequence << "):";
  for (int32_t value : blocks) std::cout << " " << value;
  std::cout << std::endl;

  // A typed error: the ranks disagree on the size, and every rank gets
  // INVALID_ARGUMENT whose facts say what each rank asked for.
  std::vector<float> sized(rank + 1, 1.0f), unused;
  absl::Status mismatch =
      comm.AllReduce(sized, &unused, chorus::ReduceOp::kSum);
  const std::optional<chorus::StatusFacts> facts =
      chorus::StatusFactsOf(mismatch);
  if (!absl::IsInvalidArgument(mismatch) || !facts.has_value() ||
      facts->reason != "MISMATCH") {
    return Fail("expected a mismatch", mismatch);
  }
  std::cout << "typed error: " << absl::StatusCodeToString(mismatch.code())
            << ", reason " << facts->reason << ", call #" << facts->sequence
            << std::endl;
  for (const auto& [asking_rank, asked] : facts->ranks) {
    std::cout << "  rank " << asking_rank << " asked for " << asked
              << std::endl;
  }

  // The group goes on after a mismatch.
  absl::Status barrier = comm.Barrier();
  if (!barrier.ok()) return Fail("barrier", barrier);
  std::cout << "barrier: ok" << std::endl;
  return 0;
}
