#include "common/status_detail.h"

#include <utility>

#include "absl/strings/cord.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"

namespace chorus {

v1::ErrorDetail MakeErrorDetail(absl::string_view reason,
                                absl::string_view group, uint64_t epoch,
                                uint64_t sequence) {
  v1::ErrorDetail detail;
  detail.set_reason(std::string(reason));
  detail.set_group(std::string(group));
  detail.set_epoch(epoch);
  detail.set_sequence(sequence);
  return detail;
}

absl::Status WithErrorDetail(absl::Status status,
                             const v1::ErrorDetail& detail) {
  if (status.ok()) return status;
  // Deterministic, so that equal details (maps included) give equal
  // statuses.
  std::string bytes;
  {
    google::protobuf::io::StringOutputStream raw(&bytes);
    google::protobuf::io::CodedOutputStream out(&raw);
    out.SetSerializationDeterministic(true);
    detail.SerializeToCodedStream(&out);
  }
  status.SetPayload(kErrorDetailTypeUrl, absl::Cord(std::move(bytes)));
  return status;
}

std::optional<v1::ErrorDetail> ErrorDetailOf(const absl::Status& status) {
  auto payload = status.GetPayload(kErrorDetailTypeUrl);
  if (!payload.has_value()) return std::nullopt;
  v1::ErrorDetail detail;
  if (!detail.ParseFromString(std::string(*payload))) return std::nullopt;
  return detail;
}

absl::Status StatusWithDetail(absl::StatusCode code, absl::string_view message,
                              const v1::ErrorDetail& detail) {
  absl::Status status(code, message);
  if (detail.reason().empty()) return status;
  return WithErrorDetail(std::move(status), detail);
}

absl::Status RewordedStatus(const absl::Status& from, absl::StatusCode code,
                            absl::string_view message) {
  absl::Status status(code, message);
  auto payload = from.GetPayload(kErrorDetailTypeUrl);
  if (payload.has_value() && !status.ok()) {
    status.SetPayload(kErrorDetailTypeUrl, *std::move(payload));
  }
  return status;
}

}  // namespace chorus
