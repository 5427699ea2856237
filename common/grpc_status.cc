#include "common/grpc_status.h"

#include <optional>
#include <string>

#include "chorus/v1/status.pb.h"
#include "common/status_detail.h"

namespace chorus {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  const auto code = static_cast<grpc::StatusCode>(status.code());
  std::string message(status.message());
  std::optional<v1::ErrorDetail> detail = ErrorDetailOf(status);
  if (!detail.has_value()) return grpc::Status(code, std::move(message));
  v1::RpcStatus rpc;
  rpc.set_code(static_cast<int>(status.code()));
  rpc.set_message(message);
  v1::PackedDetail* packed = rpc.add_details();
  packed->set_type_url(std::string(kErrorDetailTypeUrl));
  packed->set_value(detail->SerializeAsString());
  return grpc::Status(code, std::move(message), rpc.SerializeAsString());
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  absl::Status converted(static_cast<absl::StatusCode>(status.error_code()),
                         status.error_message());
  if (status.error_details().empty()) return converted;
  v1::RpcStatus rpc;
  if (!rpc.ParseFromString(status.error_details())) return converted;
  for (const v1::PackedDetail& packed : rpc.details()) {
    v1::ErrorDetail detail;
    if (packed.type_url() == kErrorDetailTypeUrl &&
        detail.ParseFromString(packed.value())) {
      return WithErrorDetail(std::move(converted), detail);
    }
  }
  return converted;
}

}  // namespace chorus
