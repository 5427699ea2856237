#include "server/coordinator/election/etcd_state_log.h"

#include <glog/logging.h>

#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "chorus/v1/state.pb.h"
#include "common/device_proto.h"
#include "common/status_detail.h"
#include "server/coordinator/collective_proto.h"
#include "server/coordinator/election/etcd_client.h"

namespace chorus {
namespace {

v1::StoredWorker WorkerToProto(const WorkerRecord& record) {
  const WorkerRegistration& from = record.registration;
  v1::StoredWorker stored;
  stored.set_worker_id(record.id);
  stored.set_job(from.job);
  v1::RegisterWorkerRequest& to = *stored.mutable_registration();
  to.set_name(from.name);
  to.set_host(from.host);
  to.set_machine(from.machine);
  to.set_address(from.address);
  to.set_data_port(from.data_port);
  to.set_incarnation(from.incarnation);
  to.set_cuda_support(from.cuda_support);
  for (const Device& device : from.devices) {
    *to.add_devices() = DeviceToProto(device);
  }
  return stored;
}

WorkerRecord WorkerFromProto(const v1::StoredWorker& stored) {
  WorkerRecord record;
  record.id = stored.worker_id();
  record.registration = RegistrationFromProto(stored.registration());
  record.registration.job = stored.job();
  return record;
}

v1::StoredGroup GroupToProto(const StoredGroup& group) {
  const GroupView& view = group.view;
  v1::StoredGroup stored;
  stored.set_job(group.job);
  stored.set_name(view.name);
  stored.set_epoch(view.epoch);
  stored.set_min_world_size(view.min_world_size);
  stored.set_max_world_size(view.max_world_size);
  stored.set_same_host(view.same_host);
  stored.set_nccl(view.nccl);
  for (const GroupMember& member : view.members) {
    v1::StoredMember* to = stored.add_members();
    *to->mutable_member() = MemberToProto(member);
    to->set_machine(member.machine);
  }
  for (const std::string& id : group.request_ids) stored.add_request_ids(id);
  if (!group.aborted.ok()) {
    stored.set_aborted_code(static_cast<int>(group.aborted.code()));
    stored.set_aborted_message(std::string(group.aborted.message()));
    std::optional<v1::ErrorDetail> detail = ErrorDetailOf(group.aborted);
    if (detail.has_value()) *stored.mutable_aborted_detail() = *detail;
  }
  return stored;
}

StoredGroup GroupFromProto(const v1::StoredGroup& stored) {
  StoredGroup group;
  group.job = stored.job();
  GroupView& view = group.view;
  view.name = stored.name();
  view.epoch = stored.epoch();
  view.min_world_size = stored.min_world_size();
  view.max_world_size = stored.max_world_size();
  for (const v1::StoredMember& from : stored.members()) {
    GroupMember member;
    member.rank = from.member().rank();
    member.worker_id = from.member().worker_id();
    member.worker_name = from.member().worker_name();
    member.host = from.member().host();
    member.machine = from.machine();
    member.address = from.member().address();
    member.data_port = from.member().data_port();
    member.incarnation = from.member().incarnation();
    member.device = DeviceFromProto(from.member().device());
    view.members.push_back(std::move(member));
  }
  view.world_size = static_cast<int>(view.members.size());
  view.same_host = stored.same_host();
  view.nccl = stored.nccl();
  group.request_ids.assign(stored.request_ids().begin(),
                           stored.request_ids().end());
  if (stored.aborted_code() != 0) {
    group.aborted =
        StatusWithDetail(static_cast<absl::StatusCode>(stored.aborted_code()),
                         stored.aborted_message(), stored.aborted_detail());
  }
  return group;
}

}  // namespace

EtcdStateLog::EtcdStateLog(EtcdClient* etcd, std::string prefix,
                           std::string fence_key, int endpoints,
                           std::function<void(const absl::Status&)> on_lost)
    : etcd_(etcd),
      prefix_(std::move(prefix)),
      fence_key_(std::move(fence_key)),
      endpoints_(endpoints),
      on_lost_(std::move(on_lost)) {}

std::string EtcdStateLog::WorkerKey(uint64_t id) const {
  return absl::StrCat(prefix_, "/workers/", id);
}

std::string EtcdStateLog::GroupKey(const std::string& job,
                                   const std::string& name) const {
  return absl::StrCat(prefix_, "/groups/", job, "/", name);
}

void EtcdStateLog::Write(const std::string& key,
                         std::optional<std::string> value) {
  const std::vector<EtcdWrite> writes = {EtcdWrite{key, std::move(value)}};
  absl::Status written;
  // An unreachable endpoint moves the client to the next one: each is
  // tried twice before this leader gives up.
  for (int attempt = 0; attempt < 2 * endpoints_; ++attempt) {
    written = etcd_->FencedWrite(fence_key_, fence_.load(), writes);
    if (written.ok()) {
      writes_.fetch_add(1);
      return;
    }
    if (absl::IsFailedPrecondition(written)) break;
  }
  LOG(ERROR) << "cannot write " << key << " to etcd: " << written;
  on_lost_(absl::UnavailableError(
      absl::StrCat("this coordinator could not write its state to etcd (",
                   written.message(), ")")));
}

void EtcdStateLog::SaveWorker(const WorkerRecord& record) {
  Write(WorkerKey(record.id), WorkerToProto(record).SerializeAsString());
}

void EtcdStateLog::DropWorker(uint64_t id) { Write(WorkerKey(id), {}); }

void EtcdStateLog::SaveGroup(const StoredGroup& group) {
  Write(GroupKey(group.job, group.view.name),
        GroupToProto(group).SerializeAsString());
}

void EtcdStateLog::DropGroup(const std::string& job, const std::string& name) {
  Write(GroupKey(job, name), {});
}

std::string EtcdStateLog::StoreKey(const std::string& job,
                                   const std::string& key) const {
  return absl::StrCat(prefix_, "/store/", job, "/", key);
}

void EtcdStateLog::SaveKey(const StoredKey& key) {
  Write(StoreKey(key.job, key.key), key.value);
}

void EtcdStateLog::DropKey(const std::string& job, const std::string& key) {
  Write(StoreKey(job, key), {});
}

absl::StatusOr<StoredState> EtcdStateLog::Load() {
  StoredState state;
  for (const char* kind : {"/workers/", "/groups/"}) {
    const std::string prefix = absl::StrCat(prefix_, kind);
    absl::StatusOr<std::vector<std::pair<std::string, std::string>>> listed =
        etcd_->List(prefix);
    if (!listed.ok()) return listed.status();
    for (const auto& [key, value] : *listed) {
      v1::StoredWorker worker;
      v1::StoredGroup group;
      const bool workers = absl::StrContains(kind, "workers");
      if (workers ? !worker.ParseFromString(value)
                  : !group.ParseFromString(value)) {
        return absl::DataLossError(
            absl::StrCat("etcd key ", key, " holds no Chorus state"));
      }
      if (workers) {
        state.workers.push_back(WorkerFromProto(worker));
      } else {
        state.groups.push_back(GroupFromProto(group));
      }
    }
  }
  // Store keys: PREFIX/store/JOB/KEY (a job's name has no '/').
  const std::string stored = absl::StrCat(prefix_, "/store/");
  absl::StatusOr<std::vector<std::pair<std::string, std::string>>> keys =
      etcd_->List(stored);
  if (!keys.ok()) return keys.status();
  for (const auto& [path, value] : *keys) {
    const std::string rest = path.substr(stored.size());
    const size_t slash = rest.find('/');
    if (slash == std::string::npos) {
      return absl::DataLossError(
          absl::StrCat("etcd key ", path, " names no job's store key"));
    }
    state.keys.push_back(
        StoredKey{rest.substr(0, slash), rest.substr(slash + 1), value});
  }
  return state;
}

}  // namespace chorus
