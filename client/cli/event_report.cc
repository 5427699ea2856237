#include "client/cli/event_report.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/cli/json_string.h"

namespace chorus {

std::string FormatEvent(const Event& event, absl::TimeZone zone) {
  std::string line =
      absl::StrCat(absl::FormatTime("%Y-%m-%dT%H:%M:%E6S%Ez", event.time, zone),
                   " ", EventKindName(event.kind));
  if (!event.group.empty()) absl::StrAppend(&line, " group=", event.group);
  if (event.epoch != 0) absl::StrAppend(&line, " epoch=", event.epoch);
  if (event.sequence != 0) absl::StrAppend(&line, " seq=", event.sequence);
  if (!event.ranks.empty()) {
    absl::StrAppend(&line, " ranks=", absl::StrJoin(event.ranks, ","));
  }
  if (!event.worker_name.empty()) {
    absl::StrAppend(&line, " worker=", event.worker_name);
  }
  if (event.worker_id != 0) {
    absl::StrAppend(&line, " worker_id=", event.worker_id);
  }
  if (!event.reason.empty()) absl::StrAppend(&line, " reason=", event.reason);
  if (event.dropped != 0) absl::StrAppend(&line, " dropped=", event.dropped);
  if (!event.status.ok()) {
    absl::StrAppend(&line,
                    " code=", absl::StatusCodeToString(event.status.code()));
  }
  absl::StrAppend(&line, ": ", event.text);
  return line;
}

std::string EventJson(const Event& event) {
  return absl::StrCat(
      "{\"time_ns\": ", absl::ToUnixNanos(event.time), ", \"time\": ",
      JsonString(absl::FormatTime("%Y-%m-%dT%H:%M:%E9SZ", event.time,
                                  absl::UTCTimeZone())),
      ", \"kind\": ", JsonString(EventKindName(event.kind)),
      ", \"worker_id\": ", event.worker_id,
      ", \"worker_name\": ", JsonString(event.worker_name),
      ", \"group\": ", JsonString(event.group), ", \"epoch\": ", event.epoch,
      ", \"sequence\": ", event.sequence, ", \"ranks\": [",
      absl::StrJoin(event.ranks, ", "), "], \"code\": ",
      JsonString(absl::StatusCodeToString(event.status.code())),
      ", \"message\": ", JsonString(event.status.message()),
      ", \"reason\": ", JsonString(event.reason),
      ", \"dropped\": ", event.dropped, ", \"text\": ", JsonString(event.text),
      "}");
}

}  // namespace chorus
