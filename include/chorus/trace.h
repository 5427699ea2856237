// TraceEntry: one collective of a group as the coordinator's flight
// recorder saw it (see AdminClient::Trace): when each rank called and what
// it asked for, the plan, the commits of a data-plane plan and the verdict.
// An elastic group's epoch change is an entry of its own (kMembershipChanged).
//
// Plain values; thread-compatible.
#ifndef CHORUS_INCLUDE_CHORUS_TRACE_H_
#define CHORUS_INCLUDE_CHORUS_TRACE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "chorus/types.h"

namespace chorus {

struct TraceEntry {
  // kMembershipChanged: not a collective but the revocation of an elastic
  // group's `epoch` (sequence 0, no ranks): `verdict` is the ABORTED status
  // every call of that epoch got, naming who left or was admitted and the
  // epoch the group goes on at; `ended` is when it happened.
  enum class State {
    kWaiting,
    kDecided,
    kCompleted,
    kFailed,
    kMembershipChanged
  };

  // Numbers every entry the recorder made, across groups, from 1.
  uint64_t record_id = 0;
  uint64_t epoch = 0;
  uint64_t sequence = 0;
  // The spec of the first rank that called.
  CollectiveSpec spec;
  // Per rank: when it called (InfinitePast() if it did not) and what it
  // asked for ("all_reduce f32[8] sum"; empty if it did not call).
  std::vector<absl::Time> arrived;
  std::vector<std::string> asked;
  State state = State::kWaiting;
  // When every rank had called and the plan was chosen (kDecided and after).
  absl::Time decided = absl::InfinitePast();
  Algorithm plan = Algorithm::kUnspecified;
  // Per rank: when it committed a data-plane plan (InfinitePast() if not).
  std::vector<absl::Time> committed;
  // When and how the call ended (kCompleted: OK; kFailed: the verdict).
  absl::Time ended = absl::InfinitePast();
  absl::Status verdict;
};

// Returns "waiting", "decided", "completed", "failed" or
// "membership_changed".
inline const char* TraceStateName(TraceEntry::State state) {
  switch (state) {
    case TraceEntry::State::kWaiting:
      return "waiting";
    case TraceEntry::State::kDecided:
      return "decided";
    case TraceEntry::State::kCompleted:
      return "completed";
    case TraceEntry::State::kFailed:
      return "failed";
    case TraceEntry::State::kMembershipChanged:
      return "membership_changed";
  }
  return "unknown";
}

}  // namespace chorus

#endif  // CHORUS_INCLUDE_CHORUS_TRACE_H_
