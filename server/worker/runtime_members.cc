// WorkerRuntime: the members of this worker's groups. A join reply lists
// every member of a small group; a large group's reply lists none (the
// worker asks for members on request, JoinGroupRequest.members_on_request),
// and the members a rank talks to are fetched from the coordinator as they
// are needed: by a send to a rank not known yet (ResolvePeer), and by a
// chunk arriving from one (the peer directory's resolver).
#include <glog/logging.h>
#include <grpcpp/client_context.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/device_proto.h"
#include "common/grpc_status.h"
#include "server/worker/coordinator_status.h"
#include "server/worker/worker_runtime.h"

namespace chorus {
namespace {

// The largest world a join reply may announce without listing it; a bound
// on what this worker allocates per membership.
constexpr int kMaxUnlistedWorld = 1 << 20;

}  // namespace

void WorkerRuntime::LearnPeerOf(const v1::GroupMember& member) {
  if (member.address() == address_) return;
  PeerRegistration identity;
  identity.worker_id = member.worker_id();
  identity.incarnation = member.incarnation();
  identity.data_port = member.data_port();
  identity.name = member.worker_name();
  sender_->LearnPeer(member.address(), identity);
}

absl::StatusOr<Membership> WorkerRuntime::LearnMembership(
    const std::string& group, int rank, int expected_world,
    const Device& device, const v1::JoinGroupResponse& response) {
  Membership membership;
  membership.group = group;
  membership.epoch = response.epoch();
  membership.rank = response.has_rank() ? response.rank() : rank;
  membership.members_listed =
      response.members_size() > 0 || response.world_size() == 0;
  membership.world_size = membership.members_listed ? response.members_size()
                                                    : response.world_size();
  membership.device = device;
  membership.inline_max_bytes = response.inline_max_bytes();
  membership.all_reduce_inline_max_bytes =
      response.has_all_reduce_inline_max_bytes()
          ? response.all_reduce_inline_max_bytes()
          : response.inline_max_bytes();
  membership.leader_calls =
      response.leader_calls() && membership.members_listed;
  if (response.leader_patience_ms() > 0) {
    membership.leader_patience =
        absl::Milliseconds(response.leader_patience_ms());
  }
  membership.min_world_size = response.min_world_size();
  membership.max_world_size = response.max_world_size();
  for (const v1::GroupMember& member : response.members()) {
    membership.addresses.push_back(member.address());
    membership.devices.push_back(DeviceFromProto(member.device()));
    membership.worker_names.push_back(member.worker_name());
    LearnPeerOf(member);
  }
  if (response.has_rank() != (expected_world == 0) ||
      (expected_world != 0 && membership.world_size != expected_world) ||
      membership.world_size > kMaxUnlistedWorld) {
    return absl::InternalError("the coordinator returned a partial group");
  }
  if (membership.rank < 0 || membership.rank >= membership.world_size) {
    return absl::InternalError(absl::StrCat(
        "the coordinator returned group ", group, " of ", membership.world_size,
        " ranks without rank ", membership.rank));
  }
  if (membership.members_listed) {
    peers_.Learn(membership.group, membership.epoch, membership.worker_names);
    return membership;
  }
  // Only this rank is known: the others are fetched when needed.
  membership.addresses.resize(membership.world_size);
  membership.devices.resize(membership.world_size);
  membership.worker_names.resize(membership.world_size);
  membership.addresses[membership.rank] = address_;
  membership.devices[membership.rank] = device;
  membership.worker_names[membership.rank] = name_;
  peers_.LearnPartial(
      membership.group, membership.epoch, membership.world_size,
      PeerDirectory::RankPeer{membership.rank, name_, address_});
  return membership;
}

absl::StatusOr<std::vector<PeerDirectory::RankPeer>>
WorkerRuntime::FetchMembers(const std::string& group, uint64_t epoch,
                            int self_rank, const std::vector<int>& ranks,
                            absl::Time deadline) {
  v1::GetGroupMembersRequest request;
  request.set_group(group);
  request.set_epoch(epoch);
  request.set_rank(self_rank);
  for (int rank : ranks) request.add_ranks(rank);
  v1::GetGroupMembersResponse response;
  grpc::ClientContext context;
  const absl::Time now = absl::Now();
  context.set_deadline(
      absl::ToChronoTime(std::min(deadline, now + options_.rpc_timeout)));
  absl::Status status = FromCoordinator(
      session_->stub()->GetGroupMembers(&context, request, &response),
      options_.coordinator, "the member lookup", now);
  if (!status.ok()) return status;
  if (response.members_size() != static_cast<int>(ranks.size())) {
    return absl::InternalError(
        absl::StrCat("the coordinator returned ", response.members_size(),
                     " members of group ", group, " for ", ranks.size()));
  }
  std::vector<PeerDirectory::RankPeer> peers;
  peers.reserve(ranks.size());
  for (int i = 0; i < response.members_size(); ++i) {
    const v1::GroupMember& member = response.members(i);
    LearnPeerOf(member);
    peers.push_back({ranks[i], member.worker_name(), member.address()});
  }
  peers_.LearnRanks(group, epoch, peers);
  return peers;
}

absl::StatusOr<PeerDirectory::RankPeer> WorkerRuntime::ResolvePeer(
    const Membership& membership, int rank, absl::Time deadline) {
  std::string address =
      peers_.Address(membership.group, membership.epoch, rank);
  if (!address.empty()) {
    return PeerDirectory::RankPeer{
        rank, peers_.WorkerName(membership.group, membership.epoch, rank),
        std::move(address)};
  }
  while (true) {
    absl::StatusOr<std::vector<PeerDirectory::RankPeer>> fetched = FetchMembers(
        membership.group, membership.epoch, membership.rank, {rank}, deadline);
    if (fetched.ok()) return fetched->front();
    // The leader is gone: ask the next one, as a call's commit does.
    if (!RetriesAfterFailover(fetched.status(), deadline)) {
      return fetched.status();
    }
    WaitForNextBeat(deadline);
  }
}

void WorkerRuntime::ResolveArrivals() {
  peers_.SetResolver([this](const std::string& group, uint64_t epoch,
                            int self_rank, int rank) {
    absl::StatusOr<std::vector<PeerDirectory::RankPeer>> fetched = FetchMembers(
        group, epoch, self_rank, {rank}, absl::Now() + options_.rpc_timeout);
    if (!fetched.ok()) {
      LOG(WARNING) << "data plane: cannot learn which worker holds rank "
                   << rank << " of group " << group << " at epoch " << epoch
                   << ": " << fetched.status();
    }
  });
}

}  // namespace chorus
