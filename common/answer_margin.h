// AnswerMargin: how a waiting call's time is split along the chain
// client -> worker -> coordinator and peers. Each party ends its own wait a
// margin before its caller's deadline, so the caller hears that party's
// verdict (which names who did not answer) instead of giving up with its
// own bare DEADLINE_EXCEEDED: the worker's local API answers a margin
// before the client's deadline, a rank's waits on its peers end a margin
// before the rank must answer (leaving time to report the failure and hear
// the group's verdict), and the coordinator's core ends a call a margin
// before the worker's deadline (CoreDeadline).
//
// Thread safety: a pure function.
#ifndef CHORUS_COMMON_ANSWER_MARGIN_H_
#define CHORUS_COMMON_ANSWER_MARGIN_H_

#include <algorithm>

#include "absl/time/time.h"

namespace chorus {

// Returns the part of a wait of `timeout` kept for answering the caller: a
// tenth of it, between 5 ms and 250 ms, and never more than `timeout`
// itself (zero for a timeout that is not positive).
inline absl::Duration AnswerMargin(absl::Duration timeout) {
  if (timeout <= absl::ZeroDuration()) return absl::ZeroDuration();
  return std::min(timeout, std::clamp(timeout / 10, absl::Milliseconds(5),
                                      absl::Milliseconds(250)));
}

}  // namespace chorus

#endif  // CHORUS_COMMON_ANSWER_MARGIN_H_
