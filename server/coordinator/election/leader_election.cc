#include "server/coordinator/election/leader_election.h"

#include <glog/logging.h>

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_detail.h"
#include "server/coordinator/election/etcd_client.h"

namespace chorus {
namespace {

// Now on the steady clock, in nanoseconds.
int64_t SteadyNow() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

LeaderElection::LeaderElection(
    EtcdClient* etcd, ElectionOptions options,
    std::function<void(const absl::Status& why)> on_deposed)
    : etcd_(etcd),
      options_(std::move(options)),
      on_deposed_(std::move(on_deposed)) {}

LeaderElection::~LeaderElection() { Stop(); }

void LeaderElection::Start(const std::string& address) {
  {
    absl::MutexLock lock(&mu_);
    address_ = address;
  }
  thread_ = std::thread([this] { Run(); });
}

std::string LeaderElection::Address() const {
  absl::MutexLock lock(&mu_);
  return address_;
}

void LeaderElection::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_ && !thread_.joinable()) return;
    stopping_ = true;
  }
  etcd_->CancelWaits();
  if (thread_.joinable()) thread_.join();
}

absl::Status LeaderElection::CheckLeading() const {
  if (SteadyNow() < leading_until_.load(std::memory_order_acquire)) {
    return absl::OkStatus();
  }
  v1::ErrorDetail detail = MakeErrorDetail("NOT_LEADER", "", 0, 0);
  std::string leader = Leader();
  const std::string address = Address();
  // A leader whose lease ran out does not name itself.
  if (leader == address) leader.clear();
  detail.set_leader(leader);
  return WithErrorDetail(
      absl::UnavailableError(absl::StrCat(
          "coordinator ", address, " is a standby; ",
          leader.empty() ? std::string("no coordinator leads right now")
                         : absl::StrCat("the leader is ", leader))),
      detail);
}

bool LeaderElection::Leading() const { return CheckLeading().ok(); }

std::string LeaderElection::Leader() const {
  absl::MutexLock lock(&mu_);
  return leader_;
}

std::string LeaderElection::Describe() const {
  if (Leading()) return "leader (elected on etcd)";
  const std::string leader = Leader();
  return leader.empty() || leader == Address()
             ? "standby; no coordinator leads right now"
             : absl::StrCat("standby; the leader is ", leader);
}

void LeaderElection::SetLeader(const std::string& leader) {
  absl::MutexLock lock(&mu_);
  if (!leader.empty() && leader != leader_) leader_changes_.fetch_add(1);
  if (leader != leader_) {
    LOG(INFO) << "coordinator leader: "
              << (leader.empty() ? std::string("none") : leader);
  }
  leader_ = leader;
}

bool LeaderElection::WaitUntil(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto stopping = [this]()
                      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_; };
  mu_.AwaitWithDeadline(absl::Condition(&stopping), deadline);
  return stopping_;
}

absl::StatusOr<absl::Duration> LeaderElection::LiveLease(int64_t* renewed_at) {
  *renewed_at = SteadyNow();
  if (lease_id_ != 0) {
    absl::StatusOr<absl::Duration> renewed = etcd_->KeepAlive(lease_id_);
    if (!absl::IsNotFound(renewed.status())) return renewed;
    lease_id_ = 0;
  }
  *renewed_at = SteadyNow();
  absl::StatusOr<std::pair<int64_t, absl::Duration>> granted =
      etcd_->GrantLease(options_.lease);
  if (!granted.ok()) return granted.status();
  etcd_writes_.fetch_add(1);
  lease_id_ = granted->first;
  return granted->second;
}

void LeaderElection::Run() {
  const std::string address = Address();
  while (true) {
    int64_t renewed_at = 0;
    absl::StatusOr<absl::Duration> ttl = LiveLease(&renewed_at);
    absl::StatusOr<EtcdCreate> campaign =
        ttl.ok() ? etcd_->CreateIfAbsent(options_.key, address, lease_id_)
                 : absl::StatusOr<EtcdCreate>(ttl.status());
    if (!campaign.ok()) {
      LOG_EVERY_N(WARNING, 10) << "leader election: " << campaign.status();
      if (WaitUntil(absl::Now() + options_.retry_interval)) return;
      continue;
    }
    if (campaign->created) etcd_writes_.fetch_add(1);
    if (campaign->created || campaign->current.lease == lease_id_) {
      absl::Status taken = on_elected_
                               ? on_elected_(campaign->current.create_revision)
                               : absl::OkStatus();
      if (!taken.ok()) {
        LOG(ERROR) << "elected, but cannot take over: " << taken;
        etcd_->RevokeLease(lease_id_).IgnoreError();
        on_deposed_(taken);
        return;
      }
      leading_until_.store(renewed_at + absl::ToInt64Nanoseconds(*ttl),
                           std::memory_order_release);
      SetLeader(address);
      elected_.fetch_add(1);
      LOG(INFO) << "leading the cluster (etcd key " << options_.key
                << ", lease " << *ttl << ")";
      if (!Lead(*ttl)) return;
      continue;
    }
    SetLeader(campaign->current.value);
    // Campaign again once the key changes (the leader resigned or its
    // lease expired), or after a lease at most, to renew ours.
    absl::Status changed = etcd_->WaitForChange(
        options_.key, campaign->revision, absl::Now() + *ttl / 2);
    if (absl::IsCancelled(changed)) return;  // Stop()
    if (!changed.ok() && !absl::IsDeadlineExceeded(changed) &&
        WaitUntil(absl::Now() + options_.retry_interval)) {
      return;
    }
  }
}

bool LeaderElection::Lead(absl::Duration ttl) {
  absl::Status lost;
  while (lost.ok()) {
    if (WaitUntil(absl::Now() + ttl / 3)) {
      // Resign: a standby takes over without waiting for the lease.
      leading_until_.store(0, std::memory_order_release);
      absl::Status revoked = etcd_->RevokeLease(lease_id_);
      etcd_writes_.fetch_add(1);
      if (!revoked.ok()) LOG(WARNING) << "resigning: " << revoked;
      SetLeader("");
      return false;
    }
    const int64_t sent = SteadyNow();
    if (sent >= leading_until_.load()) {
      lost = absl::UnavailableError(
          "the etcd lease ran out before it could be renewed");
      break;
    }
    absl::StatusOr<absl::Duration> renewed = etcd_->KeepAlive(lease_id_);
    if (renewed.ok()) {
      leading_until_.store(sent + absl::ToInt64Nanoseconds(*renewed),
                           std::memory_order_release);
    } else if (absl::IsNotFound(renewed.status())) {
      lost = renewed.status();
    } else {
      LOG(WARNING) << "renewing the leader's lease: " << renewed.status();
    }
  }
  leading_until_.store(0, std::memory_order_release);
  SetLeader("");
  LOG(ERROR) << "no longer leading: " << lost;
  on_deposed_(lost);
  return false;
}

}  // namespace chorus
