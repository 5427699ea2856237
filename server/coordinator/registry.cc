#include "server/coordinator/registry.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/coordinator/state_log.h"

namespace chorus {
namespace {

absl::Status ValidateRegistration(const WorkerRegistration& request) {
  if (request.name.empty()) {
    return absl::InvalidArgumentError("worker name must not be empty");
  }
  if (request.address.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "worker ", request.name, " must give the address it serves on"));
  }
  if (request.devices.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker ", request.name, " registers no devices"));
  }
  for (const Device& device : request.devices) {
    absl::Status valid = ValidateDevice(device);
    if (!valid.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("worker ", request.name, ": ", valid.message()));
    }
  }
  absl::Status unique = CheckNoDuplicates(request.devices);
  if (!unique.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker ", request.name, ": ", unique.message()));
  }
  // The coordinator cannot know how many GPUs a worker has; the worker checks
  // its indices before registering.
  DeviceSupport support;
  support.cuda_built = request.cuda_support;
  for (const Device& device : request.devices) {
    absl::Status supported = CheckDeviceSupported(device, support);
    if (!supported.ok()) return supported;
  }
  return absl::OkStatus();
}

}  // namespace

Registry::Registry(Clock* clock, absl::Duration lease_timeout, StateLog* log)
    : clock_(clock), lease_timeout_(lease_timeout), log_(log) {}

absl::StatusOr<RegisterResult> Registry::Register(
    const WorkerRegistration& request) {
  absl::Status valid = ValidateRegistration(request);
  if (!valid.ok()) return valid;

  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_->Now();
  RegisterResult result;
  auto by_name = id_by_name_.find(std::make_pair(request.job, request.name));
  if (by_name != id_by_name_.end()) {
    WorkerRecord& existing = workers_.at(by_name->second);
    if (existing.registration.incarnation == request.incarnation) {
      existing.registration = request;
      existing.renewed_at = now;
      result.worker_id = existing.id;
      result.retried = true;
      return result;
    }
    result.replaced_id = existing.id;
    workers_.erase(existing.id);
    id_by_name_.erase(by_name);
    result.replaced = true;
    if (log_ != nullptr) log_->DropWorker(result.replaced_id);
  }
  WorkerRecord record;
  record.id = next_id_++;
  record.registration = request;
  record.registered_at = now;
  record.renewed_at = now;
  id_by_name_[std::make_pair(request.job, request.name)] = record.id;
  result.worker_id = record.id;
  if (log_ != nullptr) log_->SaveWorker(record);
  workers_.emplace(record.id, std::move(record));
  return result;
}

absl::Status Registry::FindLocked(uint64_t id, uint64_t incarnation) const {
  auto it = workers_.find(id);
  if (it == workers_.end()) {
    return absl::NotFoundError(
        absl::StrCat("unknown worker id ", id, "; register again"));
  }
  if (it->second.registration.incarnation != incarnation) {
    return absl::FailedPreconditionError(absl::StrCat(
        "worker id ", id, " belongs to incarnation ",
        it->second.registration.incarnation, ", not ", incarnation));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<Device>> Registry::Withdraw(
    uint64_t id, uint64_t incarnation, const std::vector<Device>& devices) {
  absl::MutexLock lock(&mu_);
  absl::Status found = FindLocked(id, incarnation);
  if (!found.ok()) return found;
  WorkerRecord& record = workers_.at(id);
  std::vector<Device>& registered = record.registration.devices;
  std::vector<Device> dropped;
  for (const Device& device : devices) {
    auto it = std::find_if(
        registered.begin(), registered.end(),
        [&](const Device& have) { return SameDevice(have, device); });
    if (it == registered.end()) continue;
    dropped.push_back(*it);
    registered.erase(it);
  }
  if (!dropped.empty() && log_ != nullptr) log_->SaveWorker(record);
  return dropped;
}

absl::Status Registry::Renew(uint64_t id, uint64_t incarnation) {
  absl::MutexLock lock(&mu_);
  absl::Status found = FindLocked(id, incarnation);
  if (!found.ok()) return found;
  workers_.at(id).renewed_at = clock_->Now();
  return absl::OkStatus();
}

absl::StatusOr<WorkerRecord> Registry::Deregister(uint64_t id,
                                                  uint64_t incarnation) {
  absl::MutexLock lock(&mu_);
  absl::Status found = FindLocked(id, incarnation);
  if (!found.ok()) return found;
  WorkerRecord record = std::move(workers_.at(id));
  id_by_name_.erase(
      std::make_pair(record.registration.job, record.registration.name));
  workers_.erase(id);
  if (log_ != nullptr) log_->DropWorker(id);
  return record;
}

int Registry::RenewAll() {
  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_->Now();
  for (auto& [id, record] : workers_) record.renewed_at = now;
  return static_cast<int>(workers_.size());
}

std::vector<WorkerRecord> Registry::EvictExpired() {
  std::vector<WorkerRecord> evicted;
  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_->Now();
  for (auto it = workers_.begin(); it != workers_.end();) {
    if (now - it->second.renewed_at > lease_timeout_) {
      id_by_name_.erase(std::make_pair(it->second.registration.job,
                                       it->second.registration.name));
      if (log_ != nullptr) log_->DropWorker(it->first);
      evicted.push_back(std::move(it->second));
      it = workers_.erase(it);
    } else {
      ++it;
    }
  }
  return evicted;
}

absl::StatusOr<std::string> Registry::NameOf(uint64_t id) const {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(id);
  if (it == workers_.end()) {
    return absl::NotFoundError(absl::StrCat("unknown worker id ", id));
  }
  return it->second.registration.name;
}

absl::StatusOr<std::string> Registry::JobOf(uint64_t id) const {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(id);
  if (it == workers_.end()) {
    return absl::NotFoundError(absl::StrCat("unknown worker id ", id));
  }
  return it->second.registration.job;
}

void Registry::HeardFrom(uint64_t id) {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(id);
  if (it != workers_.end()) it->second.renewed_at = clock_->Now();
}

absl::StatusOr<WorkerRecord> Registry::ResolveMember(
    uint64_t id, const Device& device) const {
  absl::Status valid = ValidateDevice(device);
  if (!valid.ok()) return valid;
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(id);
  if (it == workers_.end()) {
    // A worker this coordinator does not know, e.g. its join came right
    // after a coordinator restart: its next heartbeat gets NOT_FOUND and
    // it registers again on its own, so the join is worth trying again.
    return absl::UnavailableError(
        absl::StrCat("the coordinator does not know worker id ", id,
                     " (it restarted, or the worker's lease ran out); the "
                     "worker is registering again"));
  }
  const WorkerRegistration& registration = it->second.registration;
  DeviceSupport support;
  support.cuda_built = registration.cuda_support;
  absl::Status supported = CheckDeviceSupported(device, support);
  if (!supported.ok()) return supported;
  for (const Device& have : registration.devices) {
    if (SameDevice(have, device)) return it->second;
  }
  return UnsupportedDeviceError(
      device,
      absl::StrCat("worker \"", registration.name, "\" did not register it"));
}

void Registry::Restore(const std::vector<WorkerRecord>& workers) {
  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_->Now();
  for (WorkerRecord record : workers) {
    record.registered_at = now;
    record.renewed_at = now;
    next_id_ = std::max(next_id_, record.id + 1);
    id_by_name_[std::make_pair(record.registration.job,
                               record.registration.name)] = record.id;
    workers_[record.id] = std::move(record);
  }
}

std::vector<WorkerRecord> Registry::List() const {
  absl::MutexLock lock(&mu_);
  std::vector<WorkerRecord> records;
  records.reserve(workers_.size());
  for (const auto& [id, record] : workers_) records.push_back(record);
  return records;
}

absl::Time Registry::NextExpiry() const {
  absl::MutexLock lock(&mu_);
  absl::Time next = absl::InfiniteFuture();
  for (const auto& [id, record] : workers_) {
    next = std::min(next, record.renewed_at + lease_timeout_);
  }
  return next;
}

}  // namespace chorus
