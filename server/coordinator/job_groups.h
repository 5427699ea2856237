// JobGroups: the coordinator's group tables, one per job. A job's groups
// live in a table of their own, so a job's ranks can neither see nor reach
// another job's groups: two jobs may each have a group "train", a refused
// join poisons only its own job's formation, and a rank of one job cannot
// take a free rank of another's group. The default job (empty name) is the
// only one where the cluster runs without jobs (no TLS, or certificates
// naming none); its table exists from the start, the others are made when a
// worker of that job first registers (jobs are named by certificates, so
// their number is what the cluster's CA issued).
//
// Lifecycle: owned by the coordinator; tables live as long as it does.
// Thread safety: every method is thread-safe; the tables are never removed,
// so the pointers returned stay valid for the JobGroups' lifetime.
#ifndef CHORUS_SERVER_COORDINATOR_JOB_GROUPS_H_
#define CHORUS_SERVER_COORDINATOR_JOB_GROUPS_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/btree_map.h"
#include "absl/synchronization/mutex.h"
#include "server/coordinator/group_table.h"

namespace chorus {

class JobGroups {
 public:
  // No pointer is owned; `events` may be null.
  JobGroups(Clock* clock, Registry* registry, GroupTableOptions options,
            EventHub* events);

  JobGroups(const JobGroups&) = delete;
  JobGroups& operator=(const JobGroups&) = delete;

  // Returns `job`'s table, or null when no worker of that job registered.
  GroupTable* Find(const std::string& job) const;

  // Returns `job`'s table, making it when it is new.
  GroupTable& Make(const std::string& job);

  // Returns every table: the default job's first, then by job name.
  std::vector<GroupTable*> All() const;

  // The default job's table.
  GroupTable& default_table() const { return *default_; }

 private:
  Clock* const clock_;        // not owned
  Registry* const registry_;  // not owned
  const GroupTableOptions options_;
  EventHub* const events_;  // not owned; may be null
  const std::unique_ptr<GroupTable> default_;

  mutable absl::Mutex mu_;
  absl::btree_map<std::string, std::unique_ptr<GroupTable>> jobs_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace chorus

#endif  // CHORUS_SERVER_COORDINATOR_JOB_GROUPS_H_
