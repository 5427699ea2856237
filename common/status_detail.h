// Structured facts on a status: the chorus.v1.ErrorDetail (missing ranks,
// the lost worker, the per-rank account of a mismatch) that the core attaches
// to the statuses it makes, carried as an absl::Status payload inside a
// process and as a google.rpc.Status detail on the wire (grpc_status.h, and
// the `detail` fields of the coordinator's replies).
//
// Pure functions on values; thread-safe.
#ifndef CHORUS_COMMON_STATUS_DETAIL_H_
#define CHORUS_COMMON_STATUS_DETAIL_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "chorus/v1/status.pb.h"

namespace chorus {

// The type URL of the detail, as google.protobuf.Any names it; also the
// payload's key on an absl::Status.
inline constexpr absl::string_view kErrorDetailTypeUrl =
    "type.googleapis.com/chorus.v1.ErrorDetail";

// Returns a detail with its reason, group, epoch and sequence set (see
// status.proto for the reasons).
v1::ErrorDetail MakeErrorDetail(absl::string_view reason,
                                absl::string_view group, uint64_t epoch,
                                uint64_t sequence);

// Returns `status` with `detail` attached (replacing one attached before).
// An OK status is returned unchanged: OK carries no detail.
absl::Status WithErrorDetail(absl::Status status,
                             const v1::ErrorDetail& detail);

// Returns the detail attached to `status`, or nullopt when it has none (or
// it does not parse).
std::optional<v1::ErrorDetail> ErrorDetailOf(const absl::Status& status);

// Returns a status with `code` and `message` and the detail of `detail`
// when `detail` is set (reason not empty): how statuses come back from the
// code/message/detail fields of a message.
absl::Status StatusWithDetail(absl::StatusCode code, absl::string_view message,
                              const v1::ErrorDetail& detail);

// Returns a status of `code` and `message` that keeps `from`'s detail: for a
// status rewritten with more words.
absl::Status RewordedStatus(const absl::Status& from, absl::StatusCode code,
                            absl::string_view message);

}  // namespace chorus

#endif  // CHORUS_COMMON_STATUS_DETAIL_H_
