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

}  // namespace chorus
