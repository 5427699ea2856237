// The verdicts a judge of collective calls gives, worded the same whoever
// judges (the coordinator, or a group's leader worker under the leader
// plan): calls that do not agree, and ranks that did not call in time.
//
// Pure functions on values; thread-safe.
#ifndef CHORUS_COMMON_CALL_VERDICTS_H_
#define CHORUS_COMMON_CALL_VERDICTS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "common/collective.h"

namespace chorus {

// What rank `r` asked of a call, for a mismatch account: its spec, and the
// algorithm it forced unless kUnspecified.
std::string DescribeAsked(const CollectiveSpec& spec, Algorithm forced);

// INVALID_ARGUMENT "collective #<sequence> of group <group> does not match
// across ranks: ..." with `asked` (one entry per rank, DescribeAsked) in
// the message and in a MISMATCH ErrorDetail.
absl::Status MismatchError(absl::string_view group, uint64_t epoch,
                           uint64_t sequence,
                           const std::vector<std::string>& asked);

// DEADLINE_EXCEEDED "<ranks> of group <group> did not reach <kind> #<n>
// within the deadline", with a RANKS_MISSING ErrorDetail naming `missing`.
absl::Status RanksMissingError(absl::string_view group, uint64_t epoch,
                               uint64_t sequence, CollectiveKind kind,
                               const std::vector<int>& missing);

}  // namespace chorus

#endif  // CHORUS_COMMON_CALL_VERDICTS_H_
