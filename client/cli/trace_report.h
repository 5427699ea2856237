// What `chorusctl trace` prints from the coordinator's flight recorder: one
// line per collective, an analysis that names the rank at fault (the rank
// that never called, the straggler, ranks that disagree, a missing commit),
// and a JSON dump whose field names follow PyTorch's Flight Recorder where
// they mean the same.
//
// Pure functions; thread-safe.
#ifndef CHORUS_CLIENT_CLI_TRACE_REPORT_H_
#define CHORUS_CLIENT_CLI_TRACE_REPORT_H_

#include <string>
#include <vector>

#include "absl/time/time.h"
#include "chorus/trace.h"

namespace chorus {

// One line per entry, e.g. "#4 e7 all_reduce f32[8] sum  completed inline
// ranks 0 +0us 1 +310us" (arrival after the first caller), ending in
// newlines.
std::string FormatTrace(const std::vector<TraceEntry>& entries);

// Findings, most useful first, looking at the last `recent` complete calls
// for stragglers; `now` dates calls still waiting. Empty when nothing is
// wrong.
std::vector<std::string> AnalyzeTrace(const std::vector<TraceEntry>& entries,
                                      int recent, absl::Time now);

// {"pg_name": ..., "entries": [{"record_id", "collective_seq_id",
// "profiling_name", "time_created_ns", "state", "input_sizes",
// "input_dtypes", ...}]}.
std::string TraceJson(const std::string& group,
                      const std::vector<TraceEntry>& entries);

}  // namespace chorus

#endif  // CHORUS_CLIENT_CLI_TRACE_REPORT_H_
