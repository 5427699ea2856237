#include "server/worker/answered_calls.h"

namespace chorus {

void AnsweredCalls::Record(const v1::CollectiveRequest& request,
                           uint64_t registrations) {
  absl::MutexLock lock(&mu_);
  Epoch& kept = groups_[request.group()];
  if (kept.epoch != request.epoch()) {
    if (kept.epoch > request.epoch()) return;  // an older epoch's call
    kept = Epoch{};
    kept.epoch = request.epoch();
  }
  kept.registrations = registrations;
  kept.calls.push_back(request);
  kept.calls.back().clear_replays();
  if (kept.calls.size() > kKept) kept.calls.pop_front();
}

void AnsweredCalls::AttachReplays(v1::CollectiveRequest* request,
                                  uint64_t registrations) {
  request->clear_replays();
  absl::MutexLock lock(&mu_);
  auto it = groups_.find(request->group());
  if (it == groups_.end() || it->second.epoch != request->epoch() ||
      it->second.registrations == registrations) {
    return;
  }
  for (const v1::CollectiveRequest& call : it->second.calls) {
    if (call.sequence() < request->sequence()) *request->add_replays() = call;
  }
}

void AnsweredCalls::Running(const v1::CollectiveRequest& request,
                            absl::Time deadline) {
  RunningCall call{request, deadline};
  call.request.clear_replays();
  call.request.set_running(true);
  absl::MutexLock lock(&mu_);
  running_[{request.group(), request.sequence()}] = std::move(call);
}

void AnsweredCalls::Ran(const std::string& group, uint64_t sequence) {
  absl::MutexLock lock(&mu_);
  running_.erase({group, sequence});
}

std::vector<AnsweredCalls::RunningCall> AnsweredCalls::RunningCalls() {
  absl::MutexLock lock(&mu_);
  std::vector<RunningCall> calls;
  for (const auto& [key, call] : running_) calls.push_back(call);
  return calls;
}

std::optional<AnsweredCalls::RunningCall> AnsweredCalls::FindRunning(
    const std::string& group, uint64_t sequence) {
  absl::MutexLock lock(&mu_);
  auto it = running_.find({group, sequence});
  if (it == running_.end()) return std::nullopt;
  return it->second;
}

}  // namespace chorus
