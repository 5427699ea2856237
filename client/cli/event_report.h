// What `chorusctl watch` prints for each event of the coordinator's stream:
// a line for people, or one JSON object per line for programs.
//
// Pure functions; thread-safe.
#ifndef CHORUS_CLIENT_CLI_EVENT_REPORT_H_
#define CHORUS_CLIENT_CLI_EVENT_REPORT_H_

#include <string>

#include "absl/time/time.h"
#include "chorus/event.h"

namespace chorus {

// One line (without the newline): the time in `zone` to the microsecond,
// the kind, the fields the kind sets, and the text, e.g.
// `2024-05-01T12:00:01.234567+02:00 GROUP_ABORTED group=g epoch=17
// ranks=1 worker=w1 worker_id=2 code=ABORTED: group g (epoch 17) aborted:
// ...`.
std::string FormatEvent(const Event& event, absl::TimeZone zone);

// One JSON object (without the newline) with every field: time_ns, time
// (UTC, RFC 3339), kind, worker_id, worker_name, group, epoch, sequence,
// ranks, code (e.g. "ABORTED"), message, reason, dropped and text.
std::string EventJson(const Event& event);

}  // namespace chorus

#endif  // CHORUS_CLIENT_CLI_EVENT_REPORT_H_
