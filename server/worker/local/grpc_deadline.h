// The time a caller of the worker's gRPC local API gives a call: until its
// deadline less the margin its answer needs to reach it (answer_margin.h),
// or ten minutes when it set none. Shared by the gRPC door and its
// reactors. Thread safety: a pure function.
#ifndef CHORUS_SERVER_WORKER_LOCAL_GRPC_DEADLINE_H_
#define CHORUS_SERVER_WORKER_LOCAL_GRPC_DEADLINE_H_

#include <grpcpp/server_context.h>

#include <chrono>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/answer_margin.h"

namespace chorus {

// Returns the time the call of `context` may take from now.
inline absl::Duration TimeLeft(const grpc::CallbackServerContext& context) {
  const auto deadline = context.deadline();
  if (deadline == std::chrono::system_clock::time_point::max()) {
    return absl::Minutes(10);
  }
  const absl::Duration left = absl::FromChrono(deadline) - absl::Now();
  return left - AnswerMargin(left);
}

// Returns when the call of `context` must end.
inline absl::Time CallDeadline(const grpc::CallbackServerContext& context) {
  return absl::Now() + TimeLeft(context);
}

}  // namespace chorus

#endif  // CHORUS_SERVER_WORKER_LOCAL_GRPC_DEADLINE_H_
