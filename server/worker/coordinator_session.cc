#include "server/worker/coordinator_session.h"

#include <glog/logging.h>
#include <grpcpp/client_context.h>

#include <optional>
#include <utility>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/device_proto.h"
#include "common/grpc_status.h"
#include "common/net.h"
#include "common/status_detail.h"
#include "common/tls_mismatch.h"

namespace chorus {
namespace {

uint64_t NewIncarnation() {
  absl::BitGen gen;
  return absl::Uniform<uint64_t>(gen, 1, UINT64_MAX);
}

// Codes that mean "the coordinator could not be reached or did not answer in
// time": worth trying again.
bool IsTransient(const absl::Status& status) {
  return absl::IsUnavailable(status) || absl::IsDeadlineExceeded(status) ||
         absl::IsResourceExhausted(status) || absl::IsAborted(status);
}

}  // namespace

CoordinatorSession::CoordinatorSession(SessionOptions options)
    : options_(std::move(options)),
      incarnation_(NewIncarnation()),
      target_(options_.coordinator) {}

CoordinatorSession::~CoordinatorSession() { Shutdown(); }

uint64_t CoordinatorSession::worker_id() const {
  absl::MutexLock lock(&mu_);
  return worker_id_;
}

int CoordinatorSession::call_port() const {
  absl::MutexLock lock(&mu_);
  return call_port_;
}

std::shared_ptr<v1::Coordinator::Stub> CoordinatorSession::stub() const {
  const std::string address = target_.address();
  absl::MutexLock lock(&mu_);
  if (stub_ == nullptr || stub_address_ != address) {
    stub_ = v1::Coordinator::NewStub(target_.channel());
    stub_address_ = address;
  }
  return stub_;
}

bool CoordinatorSession::Follow(const std::string& tried,
                                const absl::Status& status) {
  return target_.Follow(tried, status);
}

absl::Duration CoordinatorSession::lease() const {
  absl::MutexLock lock(&mu_);
  return lease_;
}

absl::Status CoordinatorSession::RegisterOnce(bool followed) {
  v1::RegisterWorkerRequest request;
  request.set_name(options_.name);
  request.set_host(options_.host);
  request.set_machine(options_.machine);
  request.set_data_port(options_.data_port);
  request.set_address(options_.address);
  request.set_incarnation(incarnation_);
  request.set_cuda_support(options_.cuda_support);
  request.set_nccl_version(options_.nccl_version);
  for (const Device& device : options_.devices) {
    *request.add_devices() = DeviceToProto(device);
  }
  v1::RegisterWorkerResponse response;
  grpc::ClientContext context;
  context.set_deadline(DeadlineAfter(options_.rpc_timeout));
  const std::string to = target_.address();
  absl::Status status =
      FromGrpcStatus(stub()->RegisterWorker(&context, request, &response));
  if (!status.ok()) {
    // A standby names the leader: register there at once.
    if (!followed && Follow(to, status)) return RegisterOnce(true);
    // A TLS mismatch says what to change (and is not worth retrying).
    return ExplainTlsMismatch(status, to, Role::kCoordinator);
  }
  absl::MutexLock lock(&mu_);
  worker_id_ = response.worker_id();
  call_port_ = static_cast<int>(response.call_port());
  kept_ = response.kept();
  ++registrations_;
  heartbeat_interval_ = absl::Milliseconds(
      std::max<int64_t>(1, response.heartbeat_interval_ms()));
  lease_ =
      absl::Milliseconds(std::max<int64_t>(0, response.lease_timeout_ms()));
  LOG(INFO) << "registered with " << to << " as worker " << worker_id_ << " \""
            << options_.name << "\" incarnation " << incarnation_
            << "; heartbeat every " << heartbeat_interval_;
  return absl::OkStatus();
}

bool CoordinatorSession::WaitForStopUntil(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  mu_.AwaitWithDeadline(absl::Condition(&stop_requested_), deadline);
  return stop_requested_;
}

absl::Status CoordinatorSession::Start() {
  const absl::Time give_up =
      options_.register_timeout == absl::InfiniteDuration()
          ? absl::InfiniteFuture()
          : absl::Now() + options_.register_timeout;
  absl::Status last;
  bool warned = false;
  while (true) {
    last = RegisterOnce();
    if (last.ok()) break;
    if (!IsTransient(last)) return last;
    if (!warned) {
      LOG(WARNING) << "cannot reach coordinator " << target_.address() << " ("
                   << last << "); retrying";
      warned = true;
    }
    const absl::Time next = absl::Now() + options_.retry_interval;
    if (next > give_up) {
      // Neutral wording: a daemon's --register_timeout, or an embedded
      // worker's register_timeout=.
      return absl::DeadlineExceededError(absl::StrCat(
          "could not register with coordinator ", options_.coordinator,
          " within its register timeout of ",
          absl::FormatDuration(options_.register_timeout), ": ",
          last.ToString(absl::StatusToStringMode::kWithNoExtraData)));
    }
    if (WaitForStopUntil(next)) {
      return absl::CancelledError("stopped before registering");
    }
  }
  {
    absl::MutexLock lock(&mu_);
    heartbeating_ = true;
  }
  heartbeat_thread_ = std::thread([this] { HeartbeatLoop(); });
  return absl::OkStatus();
}

void CoordinatorSession::HeartbeatLoop() {
  Beats beats;
  while (true) {
    absl::Duration interval;
    {
      absl::MutexLock lock(&mu_);
      interval = heartbeat_interval_;
    }
    // While the coordinator is unreachable, try at the retry pace so the
    // worker is back in the registry soon after the coordinator returns.
    if (beats.coordinator_lost) {
      interval = std::min(interval, options_.retry_interval);
    }
    std::vector<std::function<void()>> checked;
    {
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithDeadline(
          absl::Condition(this, &CoordinatorSession::StopOrCheckLocked),
          absl::Now() + interval);
      if (stop_requested_) break;
      // This beat serves the checks asked for so far.
      checked.swap(after_check_);
      for (std::function<void()>& then : after_beat_) {
        checked.push_back(std::move(then));
      }
      after_beat_.clear();
    }
    Beat(&beats);
    for (std::function<void()>& then : checked) then();
  }
  std::vector<std::function<void()>> left;
  {
    absl::MutexLock lock(&mu_);
    heartbeating_ = false;
    left.swap(after_check_);
    for (std::function<void()>& then : after_beat_) {
      left.push_back(std::move(then));
    }
    after_beat_.clear();
  }
  for (std::function<void()>& then : left) then();
}

void CoordinatorSession::Beat(Beats* beats) {
  uint64_t id;
  {
    absl::MutexLock lock(&mu_);
    id = worker_id_;
  }
  v1::HeartbeatRequest request;
  request.set_worker_id(id);
  request.set_incarnation(incarnation_);
  request.set_aborts_seen(aborts_seen_);
  if (options_.withdrawn) {
    for (const Device& device : options_.withdrawn()) {
      *request.add_withdrawn() = DeviceToProto(device);
    }
  }
  v1::HeartbeatResponse response;
  grpc::ClientContext context;
  context.set_deadline(DeadlineAfter(options_.rpc_timeout));
  const std::string to = target_.address();
  absl::Status status =
      FromGrpcStatus(stub()->Heartbeat(&context, request, &response));
  // Another coordinator leads now (a standby said so, or this one missed
  // two heartbeats in a row: one slow answer moves nothing): it does not
  // know this worker yet.
  const std::optional<v1::ErrorDetail> detail = ErrorDetailOf(status);
  const bool standby = detail.has_value() && detail->reason() == "NOT_LEADER";
  if ((standby || beats->coordinator_lost) && Follow(to, status)) {
    status = absl::NotFoundError(absl::StrCat("the coordinator moved from ", to,
                                              " to ", target_.address()));
  }
  if (status.ok()) {
    for (const v1::GroupAbort& abort : response.aborts()) {
      if (options_.on_group_aborted) {
        options_.on_group_aborted(
            abort.group(), abort.epoch(),
            StatusWithDetail(static_cast<absl::StatusCode>(abort.code()),
                             abort.message(), abort.detail()));
      }
    }
    aborts_seen_ = response.aborts_latest();
    if (beats->coordinator_lost) {
      LOG(INFO) << "coordinator " << to << " reachable again";
    }
    beats->coordinator_lost = false;
    beats->failed = 0;
    return;
  }
  if (absl::IsNotFound(status) || absl::IsFailedPrecondition(status)) {
    RegisterAgain(status, beats);
    return;
  }
  if (!beats->coordinator_lost) {
    LOG(WARNING) << "heartbeat to " << to << " failed: "
                 << status.ToString(absl::StatusToStringMode::kWithNoExtraData);
  } else if (++beats->failed == 2 && options_.on_forgotten &&
             target_.size() == 1) {
    // (With several coordinators, the one that takes over keeps the
    // groups and their planned collectives commit there.)
    // Unreachable for a while: the collectives it planned cannot commit.
    options_.on_forgotten(absl::UnavailableError(absl::StrCat(
        "the coordinator at ", to,
        " is unreachable: its last 3 heartbeats failed (",
        status.ToString(absl::StatusToStringMode::kWithNoExtraData), ")")));
  }
  beats->coordinator_lost = true;
}

void CoordinatorSession::RegisterAgain(const absl::Status& why, Beats* beats) {
  // The coordinator does not know us: it restarted or evicted us, or we
  // moved to another coordinator, which may have taken over our
  // registration from the leader before it.
  LOG(WARNING) << "coordinator does not know this worker (" << why
               << "); registering again";
  aborts_seen_ = 0;
  absl::Status registered = RegisterOnce();
  beats->coordinator_lost = !registered.ok();
  bool kept = false;
  if (registered.ok()) {
    absl::MutexLock lock(&mu_);
    kept = kept_;
  } else {
    LOG(ERROR) << "registering again failed: " << registered;
    // With several coordinators none may lead yet (the old leader's etcd
    // lease runs out first): nobody said this worker was forgotten, and
    // the next one to lead may keep it. The next heartbeat tries again.
    if (target_.size() > 1) return;
  }
  if (kept) {
    LOG(INFO) << "the coordinator at " << target_.address()
              << " kept this worker's registration and groups";
    if (options_.on_kept) options_.on_kept();
    return;
  }
  if (options_.on_forgotten) {
    options_.on_forgotten(absl::UnavailableError(
        "the coordinator restarted or lost this worker; join the group "
        "again"));
  }
}

bool CoordinatorSession::StopOrCheckLocked() const {
  return stop_requested_ || !after_check_.empty();
}

void CoordinatorSession::CheckRegistrationThen(std::function<void()> then) {
  {
    absl::MutexLock lock(&mu_);
    if (heartbeating_ && !stop_requested_) {
      after_check_.push_back(std::move(then));
      return;
    }
  }
  then();
}

void CoordinatorSession::AfterNextBeat(std::function<void()> then) {
  {
    absl::MutexLock lock(&mu_);
    if (heartbeating_ && !stop_requested_) {
      after_beat_.push_back(std::move(then));
      return;
    }
  }
  then();
}

uint64_t CoordinatorSession::registrations() const {
  absl::MutexLock lock(&mu_);
  return registrations_;
}

void CoordinatorSession::RequestStop() {
  absl::MutexLock lock(&mu_);
  stop_requested_ = true;
}

void CoordinatorSession::WaitForStopRequest() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(&stop_requested_));
}

void CoordinatorSession::Shutdown() {
  RequestStop();
  if (heartbeat_thread_.joinable()) heartbeat_thread_.join();
  uint64_t id;
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return;
    shut_down_ = true;
    id = worker_id_;
  }
  if (id == 0) return;
  v1::DeregisterRequest request;
  request.set_worker_id(id);
  request.set_incarnation(incarnation_);
  v1::DeregisterResponse response;
  grpc::ClientContext context;
  context.set_deadline(DeadlineAfter(options_.rpc_timeout));
  absl::Status status =
      FromGrpcStatus(stub()->Deregister(&context, request, &response));
  if (status.ok()) {
    LOG(INFO) << "deregistered worker " << id;
  } else {
    LOG(WARNING) << "deregistering worker " << id << " failed: "
                 << status.ToString(absl::StatusToStringMode::kWithNoExtraData);
  }
}

}  // namespace chorus
