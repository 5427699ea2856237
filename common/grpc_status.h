// Conversion between absl::Status (used by the core) and grpc::Status (used
// on the wire). The codes are numerically identical; messages carry over.
//
// Pure functions; thread-safe.
#ifndef CHORUS_COMMON_GRPC_STATUS_H_
#define CHORUS_COMMON_GRPC_STATUS_H_

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace chorus {

// Returns the grpc::Status with the same code and message, and the
// status's ErrorDetail as a google.rpc.Status detail when it has one.
grpc::Status ToGrpcStatus(const absl::Status& status);

// Returns the absl::Status with the same code and message, and the
// ErrorDetail of error_details() when there is one.
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace chorus

#endif  // CHORUS_COMMON_GRPC_STATUS_H_
