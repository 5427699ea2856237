#include "common/coordinator_target.h"

#include <glog/logging.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/net.h"
#include "common/status_detail.h"
#include "common/tcp_socket.h"

namespace chorus {

namespace {

std::vector<std::string> Addresses(const std::string& list) {
  std::vector<std::string> addresses =
      absl::StrSplit(list, ',', absl::SkipWhitespace());
  if (addresses.empty()) addresses.push_back(list);
  return addresses;
}

}  // namespace

absl::Status CoordinatorTarget::Check(const std::string& list) {
  for (const std::string& address : Addresses(list)) {
    if (!SplitHostPort(address).ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("coordinator address '", address,
                       "' is not host:port (a list: host:port,host:port,...)"));
    }
  }
  return absl::OkStatus();
}

CoordinatorTarget::CoordinatorTarget(const std::string& list)
    : list_(list), addresses_(Addresses(list)) {
  absl::MutexLock lock(&mu_);
  current_ = addresses_.front();
  // The first channel is made at once, as a single-address client made
  // its own: it keeps gRPC up for the target's life (chorusctl relies on
  // that to leave without waiting for gRPC's shutdown).
  channels_[current_] = MakeChannel(current_, Role::kCoordinator);
}

std::string CoordinatorTarget::address() const {
  absl::MutexLock lock(&mu_);
  return current_;
}

std::shared_ptr<grpc::Channel> CoordinatorTarget::channel() const {
  absl::MutexLock lock(&mu_);
  std::shared_ptr<grpc::Channel>& channel = channels_[current_];
  if (channel == nullptr) channel = MakeChannel(current_, Role::kCoordinator);
  return channel;
}

bool CoordinatorTarget::Follow(const std::string& tried,
                               const absl::Status& status) {
  if (status.ok()) return false;
  const std::optional<v1::ErrorDetail> detail = ErrorDetailOf(status);
  const bool standby = detail.has_value() && detail->reason() == "NOT_LEADER";
  const bool unreachable =
      !detail.has_value() &&
      (absl::IsUnavailable(status) || absl::IsDeadlineExceeded(status));
  absl::MutexLock lock(&mu_);
  if (current_ != tried) return true;  // another call moved it already
  std::string next;
  if (standby && !detail->leader().empty()) {
    next = detail->leader();
  } else if (standby || unreachable) {
    if (addresses_.size() < 2) return false;
    next = addresses_[next_ % addresses_.size()];
    if (next == current_) next = addresses_[++next_ % addresses_.size()];
    ++next_;
  } else {
    return false;
  }
  if (next == current_) return false;
  LOG(INFO) << "coordinator " << current_ << " "
            << (standby ? "is a standby" : "cannot be reached")
            << "; calls go to " << next << " now";
  current_ = next;
  return true;
}

}  // namespace chorus
