#include "common/authorization.h"

#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/revocation.h"

namespace chorus {
namespace {

constexpr uint32_t kWorker = RoleBit(Role::kWorker);
constexpr uint32_t kAdmin = RoleBit(Role::kAdmin);
constexpr uint32_t kClient = RoleBit(Role::kClient);

constexpr absl::string_view kForItself =
    "a worker acts for itself only; admins and clients look and run "
    "collectives elsewhere";
constexpr absl::string_view kToLook =
    "what the cluster holds (workers, groups, traces, events) is for admins";
constexpr absl::string_view kLocalApi =
    "the local API runs collectives as any rank: over TCP it answers client "
    "and admin certificates; local applications use the Unix socket";
constexpr absl::string_view kBetweenWorkers =
    "the data plane is between workers";
constexpr bool kOwnJob = true;

}  // namespace

const std::vector<DoorEntry>& AuthorizationTable() {
  static const auto* table = new std::vector<DoorEntry>{
      // The coordinator's gRPC service.
      {"chorus.v1.Coordinator/RegisterWorker", kWorker, kForItself},
      {"chorus.v1.Coordinator/Heartbeat", kWorker, kForItself},
      {"chorus.v1.Coordinator/Deregister", kWorker, kForItself},
      {"chorus.v1.Coordinator/JoinGroup", kWorker, kForItself},
      {"chorus.v1.Coordinator/GetGroupMembers", kWorker, kForItself},
      {"chorus.v1.Coordinator/Collective", kWorker, kForItself},
      {"chorus.v1.Coordinator/Commit", kWorker, kForItself},
      {"chorus.v1.Coordinator/ReportFailure", kWorker, kForItself},
      {"chorus.v1.Coordinator/ListWorkers", kAdmin, kToLook},
      {"chorus.v1.Coordinator/ListGroups", kAdmin, kToLook},
      {"chorus.v1.Coordinator/GetTrace", kAdmin, kToLook},
      {"chorus.v1.Coordinator/WatchEvents", kAdmin, kToLook},
      {"chorus.v1.Coordinator/Store", kWorker | kClient,
       "the store holds a job's rendezvous keys: for its ranks (workers and "
       "clients of the job)"},
      // The coordinator's call port: the same requests as frames.
      {"call port: Collective", kWorker, kForItself},
      {"call port: Commit", kWorker, kForItself},
      {"call port: ReportFailure", kWorker, kForItself},
      // A worker's local API over TCP (its Unix socket has no certificates).
      {"chorus.v1.WorkerLocal/JoinGroup", kClient | kAdmin, kLocalApi, kOwnJob},
      {"chorus.v1.WorkerLocal/Collective", kClient | kAdmin, kLocalApi,
       kOwnJob},
      {"chorus.v1.WorkerLocal/CollectiveChunked", kClient | kAdmin, kLocalApi,
       kOwnJob},
      {"chorus.v1.WorkerLocal/HoldMembership", kClient | kAdmin, kLocalApi,
       kOwnJob},
      {"chorus.v1.WorkerLocal/OpenSharedRegion", kClient | kAdmin, kLocalApi,
       kOwnJob},
      {"chorus.v1.WorkerLocal/ReleaseSharedRegion", kClient | kAdmin, kLocalApi,
       kOwnJob},
      // A worker's data plane.
      {"chorus.v1.Peer/DataPlane", kWorker, kBetweenWorkers, kOwnJob},
      {"data port: frames", kWorker, kBetweenWorkers, kOwnJob},
      // Both daemons' metrics port.
      {"GET /metrics", kAdmin | kClient, "", kOwnJob},
      {"GET /", kAdmin, kToLook},
  };
  return *table;
}

absl::Status Authorize(absl::string_view entry, const Identity& caller) {
  // Asked on every call of the call port and the gRPC services: a lookup
  // by hash rather than a scan of the table.
  static const auto* by_name = [] {
    auto* map = new absl::flat_hash_map<absl::string_view, const DoorEntry*>;
    for (const DoorEntry& e : AuthorizationTable()) (*map)[e.name] = &e;
    return map;
  }();
  const auto it = by_name->find(entry);
  if (it == by_name->end()) {
    return absl::InternalError(
        absl::StrCat(entry, " is not in the authorization table"));
  }
  if (absl::Status kept = CheckNotRevoked(caller.certificate_id); !kept.ok()) {
    return kept;
  }
  const DoorEntry* found = it->second;
  if ((found->roles & RoleBit(caller.role)) != 0) {
    if (!found->own_job || caller.role == Role::kAdmin) return absl::OkStatus();
    static const std::string* const kNoJob = new std::string;
    const std::string& served = TlsEnabled() ? OwnIdentity().job : *kNoJob;
    if (caller.job == served) return absl::OkStatus();
    return absl::PermissionDeniedError(absl::StrCat(
        entry, " serves ", JobName(served), " here; the caller is ",
        caller.Uri(), " of ", JobName(caller.job)));
  }
  std::string roles;
  for (Role role : {Role::kWorker, Role::kClient, Role::kAdmin}) {
    if ((found->roles & RoleBit(role)) == 0) continue;
    absl::StrAppend(&roles, roles.empty() ? RoleWithArticle(role) : " or ",
                    roles.empty() ? "" : RoleName(role));
  }
  return absl::PermissionDeniedError(
      absl::StrCat(entry, " needs ", roles, " certificate; the caller is ",
                   caller.Uri(), found->hint.empty() ? "" : " (", found->hint,
                   found->hint.empty() ? "" : ")"));
}

std::string JobName(absl::string_view job) {
  return job.empty() ? "the default job" : absl::StrCat("job \"", job, "\"");
}

}  // namespace chorus
