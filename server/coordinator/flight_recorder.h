// FlightRecorder: the coordinator's record of the last collectives of each
// group, for finding who is at fault when a group hangs or fails: per call,
// when each rank arrived, what each asked for, the decision (plan or
// verdict), when each rank committed, and how the call ended. Entries of a
// group survive its abort and re-formation (they carry their epoch), so a
// failed job can still be inspected.
//
// Lifecycle: owned by the group table. Thread safety: none of its own; the
// group table calls it under its lock.
#ifndef CHORUS_SERVER_COORDINATOR_FLIGHT_RECORDER_H_
#define CHORUS_SERVER_COORDINATOR_FLIGHT_RECORDER_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "chorus/trace.h"
#include "chorus/types.h"

namespace chorus {

class FlightRecorder {
 public:
  // Keeps the last `per_group` entries of each of the last `groups` group
  // names, and of a large group only as many as hold `rank_records` ranks
  // (an entry holds one record per rank: a group of 65,536 ranks would
  // otherwise keep 2,048 * 65,536 of them); at least its newest entry.
  // `per_group` 0 records nothing.
  FlightRecorder(size_t per_group, size_t groups,
                 size_t rank_records = kDefaultRankRecords);

  // About 64 MiB per group, and a GetTrace answer well within the 64 MiB
  // message limit.
  static constexpr size_t kDefaultRankRecords = size_t{1} << 20;

  // Rank `rank` of `group` (world `world`) called collective `sequence`.
  void Arrived(const std::string& group, uint64_t epoch, int world,
               uint64_t sequence, int rank, const CollectiveSpec& spec,
               absl::Time now);
  // Every rank called and the plan is `plan`; an inline plan ends the call.
  void Decided(const std::string& group, uint64_t epoch, uint64_t sequence,
               Algorithm plan, absl::Time now);
  // Rank `rank` committed a data-plane call.
  void Committed(const std::string& group, uint64_t epoch, uint64_t sequence,
                 int rank, absl::Time now);
  // The call ended with `verdict` (OK: completed).
  void Ended(const std::string& group, uint64_t epoch, uint64_t sequence,
             const absl::Status& verdict, absl::Time now);
  // Ends every call of `group` at `epoch` not ended yet with `verdict` (an
  // abort).
  void EndAll(const std::string& group, uint64_t epoch,
              const absl::Status& verdict, absl::Time now);

  // The elastic group `group` changed its membership at `epoch`: records an
  // entry of state kMembershipChanged whose verdict is `change` (the ABORTED
  // status the epoch's calls got).
  void MembershipChanged(const std::string& group, uint64_t epoch,
                         const absl::Status& change, absl::Time now);

  // The entries of `group`, oldest first; empty for a group never seen.
  std::vector<TraceEntry> Entries(const std::string& group) const;

 private:
  struct GroupTrace {
    std::deque<TraceEntry> entries;
    // The entries by (epoch, sequence): every call looks its entry up
    // several times, and a new call's first lookup would otherwise scan
    // all of them. A deque keeps its elements where they are as entries
    // come and go at its ends.
    absl::flat_hash_map<std::pair<uint64_t, uint64_t>, TraceEntry*> index;
    uint64_t last_used = 0;
    // Per-rank records in `entries` (their world sizes summed).
    size_t rank_records = 0;
  };
  TraceEntry* Find(const std::string& group, uint64_t epoch, uint64_t sequence);
  // Appends a fresh entry for (epoch, sequence) of `group`, dropping the
  // oldest entries and groups over the limits.
  TraceEntry* Add(const std::string& group, uint64_t epoch, int world,
                  uint64_t sequence, const CollectiveSpec& spec);

  const size_t per_group_;
  const size_t groups_;
  const size_t rank_records_;
  uint64_t next_record_ = 1;
  std::map<std::string, GroupTrace> traces_;
};

}  // namespace chorus

#endif  // CHORUS_SERVER_COORDINATOR_FLIGHT_RECORDER_H_
