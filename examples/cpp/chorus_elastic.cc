// A rank of an elastic Chorus group in C++: it keeps a running total that
// every step adds the group's all-reduced contributions to, goes on when a
// rank is lost (the step is done again in the next epoch), and admits
// newcomers at each step's Sync(), handing them rank 0's step and total.
// At the end every rank prints the same total.
//
// Usage: chorus_elastic WORKER GROUP WORLD RANK|new MIN_WORLD STEPS [STEP_MS]
//   WORKER     the worker daemon's local API (unix:/path or 127.0.0.1:PORT)
//   RANK|new   this rank, or "new": a newcomer to the formed group
//   MIN_WORLD  the group's minimum world size (below WORLD)
//   STEPS      steps to run; STEP_MS: time each step stands for work (10)
// Prints one line per step and per change; exits 0 after STEPS steps.
#include <chorus/communicator.h>
#include <chorus/status_facts.h>
#include <chorus/types.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace {

// What every rank holds and a newcomer is handed: the step and the total.
struct State {
  int64_t step = 0;
  int64_t total = 0;
};

// Whether `status` says the group's membership changed (the communicator
// has moved to the next epoch already).
bool MembershipChanged(const absl::Status& status) {
  const std::optional<chorus::StatusFacts> facts =
      chorus::StatusFactsOf(status);
  return facts.has_value() && facts->reason == "MEMBERSHIP_CHANGED";
}

// Overwrites `state` with rank 0's.
absl::Status HandOut(chorus::Communicator& comm, State* state) {
  chorus::CollectiveSpec spec;
  spec.kind = chorus::CollectiveKind::kBroadcast;
  spec.dtype = chorus::DType::kI64;
  spec.count = 2;
  spec.root = 0;
  const int64_t mine[2] = {state->step, state->total};
  std::string out;
  absl::StatusOr<chorus::CallResult> done = comm.Run(
      spec, std::string(reinterpret_cast<const char*>(mine), sizeof(mine)),
      &out);
  if (!done.ok()) return done.status();
  int64_t got[2];
  std::memcpy(got, out.data(), sizeof(got));
  state->step = got[0];
  state->total = got[1];
  return absl::OkStatus();
}

// One step: admits newcomers (handing them the state), then adds the
// all-reduced contributions (one per rank) to the total.
absl::Status Step(chorus::Communicator& comm, State* state, bool* state_due) {
  if (!*state_due) {
    absl::StatusOr<chorus::GroupMembership> membership = comm.Sync();
    if (!membership.ok()) return membership.status();
    *state_due = !membership->joined.empty();
    if (*state_due) {
      std::cout << "admitted " << membership->joined.size()
                << " newcomer(s): world " << membership->world_size
                << ", epoch " << membership->epoch << std::endl;
    }
  }
  if (*state_due) {
    if (absl::Status handed = HandOut(comm, state); !handed.ok()) {
      return handed;
    }
    *state_due = false;
  }
  std::vector<int64_t> one = {1};
  std::vector<int64_t> sum;
  absl::Status reduced = comm.AllReduce(one, &sum, chorus::ReduceOp::kSum);
  if (!reduced.ok()) return reduced;
  state->total += sum[0];
  ++state->step;
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 7 && argc != 8) {
    std::cerr << "usage: " << argv[0]
              << " WORKER GROUP WORLD RANK|new MIN_WORLD STEPS [STEP_MS]\n";
    return 2;
  }
  const bool newcomer = std::string(argv[4]) == "new";
  const int rank =
      newcomer ? chorus::Communicator::kNewcomer : std::atoi(argv[4]);
  const int64_t steps = std::atoll(argv[6]);
  const int step_ms = argc == 8 ? std::atoi(argv[7]) : 10;
  chorus::JoinOptions join;
  join.timeout = absl::Seconds(30);
  join.min_world_size = std::atoi(argv[5]);
  absl::StatusOr<std::unique_ptr<chorus::Communicator>> joined =
      chorus::Communicator::JoinThroughDaemon(argv[1], argv[2],
                                              std::atoi(argv[3]), rank, join);
  if (!joined.ok()) {
    std::cerr << "join: " << joined.status() << std::endl;
    return 1;
  }
  chorus::Communicator& comm = **joined;
  std::cout << "joined as rank " << comm.rank() << " of " << comm.world_size()
            << " (epoch " << comm.epoch() << ")" << std::endl;
  State state;
  bool state_due = newcomer;  // a newcomer's first step takes the state
  while (state.step < steps) {
    const absl::Status status = Step(comm, &state, &state_due);
    if (MembershipChanged(status)) {
      std::cout << "membership changed: now rank " << comm.rank() << " of "
                << comm.world_size() << ": " << status.message() << std::endl;
      continue;  // the step again, in the new epoch
    }
    if (!status.ok()) {
      std::cerr << "step " << state.step << ": " << status << std::endl;
      return 1;
    }
    std::cout << "step " << state.step << " world " << comm.world_size()
              << std::endl;
    std::this_thread::sleep_for(std::chrono::milliseconds(step_ms));
  }
  std::cout << "done: step " << state.step << " total " << state.total
            << std::endl;
  return 0;
}
