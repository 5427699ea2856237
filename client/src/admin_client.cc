#include "chorus/admin_client.h"

#include <grpcpp/client_context.h>

#include <utility>

#include "server/common/grpc_status.h"
#include "server/common/net.h"

namespace chorus {

std::unique_ptr<AdminClient> AdminClient::Connect(
    const std::string& coordinator, absl::Duration timeout) {
  return std::unique_ptr<AdminClient>(new AdminClient(
      v1::Coordinator::NewStub(MakeChannel(coordinator)), timeout));
}

AdminClient::AdminClient(std::unique_ptr<v1::Coordinator::Stub> stub,
                         absl::Duration timeout)
    : stub_(std::move(stub)), timeout_(timeout) {}

absl::StatusOr<std::vector<v1::WorkerInfo>> AdminClient::ListWorkers() const {
  grpc::ClientContext context;
  context.set_deadline(DeadlineAfter(timeout_));
  v1::ListWorkersResponse response;
  absl::Status status = FromGrpcStatus(
      stub_->ListWorkers(&context, v1::ListWorkersRequest(), &response));
  if (!status.ok()) return status;
  return std::vector<v1::WorkerInfo>(response.workers().begin(),
                                     response.workers().end());
}

absl::StatusOr<std::vector<v1::GroupInfo>> AdminClient::ListGroups() const {
  grpc::ClientContext context;
  context.set_deadline(DeadlineAfter(timeout_));
  v1::ListGroupsResponse response;
  absl::Status status = FromGrpcStatus(
      stub_->ListGroups(&context, v1::ListGroupsRequest(), &response));
  if (!status.ok()) return status;
  return std::vector<v1::GroupInfo>(response.groups().begin(),
                                    response.groups().end());
}

}  // namespace chorus
