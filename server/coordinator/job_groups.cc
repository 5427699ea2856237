#include "server/coordinator/job_groups.h"

#include <utility>

namespace chorus {

JobGroups::JobGroups(Clock* clock, Registry* registry,
                     GroupTableOptions options, EventHub* events)
    : clock_(clock),
      registry_(registry),
      options_(std::move(options)),
      events_(events),
      default_(
          std::make_unique<GroupTable>(clock, registry, options_, events)) {}

GroupTable* JobGroups::Find(const std::string& job) const {
  if (job.empty()) return default_.get();
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job);
  return it == jobs_.end() ? nullptr : it->second.get();
}

GroupTable& JobGroups::Make(const std::string& job) {
  if (job.empty()) return *default_;
  absl::MutexLock lock(&mu_);
  std::unique_ptr<GroupTable>& table = jobs_[job];
  if (table == nullptr) {
    GroupTableOptions options = options_;
    options.job = job;
    table = std::make_unique<GroupTable>(clock_, registry_, std::move(options),
                                         events_);
  }
  return *table;
}

std::vector<GroupTable*> JobGroups::All() const {
  std::vector<GroupTable*> all = {default_.get()};
  absl::MutexLock lock(&mu_);
  for (const auto& [job, table] : jobs_) all.push_back(table.get());
  return all;
}

}  // namespace chorus
