#include "tests/testing/failure_cluster.h"

#include <arpa/inet.h>
#include <grpcpp/client_context.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <linux/sock_diag.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "chorus/v1/worker.grpc.pb.h"
#include "common/grpc_status.h"
#include "common/net.h"
#include "tests/testing/wait.h"

namespace chorus::test {
namespace {

uint32_t InputValue(int rank, uint64_t i) {
  return static_cast<uint32_t>((rank + 1) * 1000003u + i);
}

std::string ToBytes(const std::vector<uint32_t>& values) {
  std::string bytes(values.size() * sizeof(uint32_t), '\0');
  std::memcpy(bytes.data(), values.data(), bytes.size());
  return bytes;
}

}  // namespace

absl::StatusOr<std::unique_ptr<FailureCluster>> FailureCluster::Start(
    const std::vector<std::string>& coordinator_flags,
    const std::vector<std::string>& worker_names) {
  std::unique_ptr<FailureCluster> cluster(new FailureCluster());
  cluster->coordinator_flags_ = coordinator_flags;
  absl::StatusOr<Daemon> coordinator = StartCoordinator(coordinator_flags);
  if (!coordinator.ok()) return coordinator.status();
  cluster->coordinator_ = *std::move(coordinator);
  cluster->stub_ = NewCoordinatorStub(cluster->coordinator_.address);
  for (const std::string& name : worker_names) {
    absl::StatusOr<int> added = cluster->AddWorker(name);
    if (!added.ok()) return added.status();
  }
  return cluster;
}

absl::StatusOr<int> FailureCluster::AddWorker(
    const std::string& name, const std::vector<std::string>& extra_flags) {
  std::vector<std::string> flags = {absl::StrCat("--name=", name),
                                    "--devices=cpu"};
  flags.insert(flags.end(), extra_flags.begin(), extra_flags.end());
  absl::StatusOr<Daemon> worker = StartWorker(coordinator_.address, flags);
  if (!worker.ok()) return worker.status();
  workers_.push_back(*std::move(worker));
  names_.push_back(name);
  return static_cast<int>(workers_.size()) - 1;
}

absl::Status FailureCluster::RestartCoordinator() {
  std::vector<std::string> flags = coordinator_flags_;
  flags.push_back(absl::StrCat("--listen=127.0.0.1:", coordinator_.port));
  absl::StatusOr<Daemon> restarted = StartCoordinator(flags);
  if (!restarted.ok()) return restarted.status();
  if (restarted->port != coordinator_.port) {
    return absl::InternalError(absl::StrCat(
        "restarted on port ", restarted->port, ", not ", coordinator_.port));
  }
  coordinator_ = *std::move(restarted);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> FailureCluster::Join(
    const std::string& group, const std::vector<int>& worker_of_rank,
    int min_world_size) {
  const int world = static_cast<int>(worker_of_rank.size());
  std::vector<absl::StatusOr<std::unique_ptr<Communicator>>> joined;
  for (int rank = 0; rank < world; ++rank) {
    joined.emplace_back(absl::UnknownError("not joined"));
  }
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      JoinOptions options;
      options.timeout = kFailureCallTimeout;
      options.min_world_size = min_world_size;
      joined[rank] = Communicator::JoinThroughDaemon(
          workers_[worker_of_rank[rank]].address, group, world, rank, options);
    });
  }
  for (std::thread& thread : threads) thread.join();
  // Every rank's failure, so that one rank waiting out its deadline does
  // not hide why another failed.
  std::vector<std::string> failures;
  absl::StatusCode code = absl::StatusCode::kOk;
  for (int rank = 0; rank < world; ++rank) {
    if (joined[rank].ok()) continue;
    if (code == absl::StatusCode::kOk) code = joined[rank].status().code();
    failures.push_back(absl::StrCat("rank ", rank, " of ", group, ": ",
                                    joined[rank].status().ToString()));
  }
  if (!failures.empty()) {
    return absl::Status(code, absl::StrJoin(failures, "; "));
  }
  std::vector<std::unique_ptr<Communicator>> out;
  for (int rank = 0; rank < world; ++rank) {
    out.push_back(*std::move(joined[rank]));
  }
  return out;
}

absl::StatusOr<v1::GroupInfo> FailureCluster::Group(const std::string& group) {
  grpc::ClientContext context;
  context.set_deadline(DeadlineAfter(kRpcTimeout));
  v1::ListGroupsResponse response;
  absl::Status status = FromGrpcStatus(
      stub_->ListGroups(&context, v1::ListGroupsRequest(), &response));
  if (!status.ok()) return status;
  for (const v1::GroupInfo& info : response.groups()) {
    if (info.name() == group) return info;
  }
  return absl::NotFoundError(absl::StrCat("no group ", group));
}

bool FailureCluster::WaitForPending(const std::string& group, uint64_t sequence,
                                    const std::vector<int>& missing,
                                    absl::Duration timeout) {
  return WaitUntil(
      [&] {
        absl::StatusOr<v1::GroupInfo> info = Group(group);
        if (!info.ok() || info->pending_sequence() != sequence) return false;
        const std::vector<int> have(info->missing_ranks().begin(),
                                    info->missing_ranks().end());
        return have == missing;
      },
      timeout, absl::Milliseconds(10));
}

bool FailureCluster::WaitForWorkers(std::vector<std::string> names,
                                    absl::Duration timeout) {
  std::sort(names.begin(), names.end());
  return WaitUntil([&] { return ListedNamesOrEmpty(*stub_) == names; },
                   timeout);
}

BackgroundCall::BackgroundCall(Communicator* communicator,
                               const CollectiveSpec& spec, std::string input,
                               const CallOptions& options)
    : started_at_(absl::Now()), input_(std::move(input)) {
  thread_ = std::thread([this, communicator, spec, options] {
    result_ = communicator->Run(spec, input_, &output_, options);
    ended_at_ = absl::Now();
    done_.Notify();
  });
}

BackgroundCall::~BackgroundCall() { thread_.join(); }

bool BackgroundCall::WaitFor(absl::Duration timeout) {
  return done_.WaitForNotificationWithTimeout(timeout);
}

bool BackgroundCall::WaitUntilTime(absl::Time deadline) {
  return done_.WaitForNotificationWithDeadline(deadline);
}

CollectiveSpec AllReduceU32(uint64_t count) {
  CollectiveSpec spec;
  spec.kind = CollectiveKind::kAllReduce;
  spec.dtype = DType::kU32;
  spec.count = count;
  spec.op = ReduceOp::kSum;
  return spec;
}

std::string RankInputU32(int rank, uint64_t count) {
  std::vector<uint32_t> values(count);
  for (uint64_t i = 0; i < count; ++i) values[i] = InputValue(rank, i);
  return ToBytes(values);
}

std::string SumOfInputsU32(int world, uint64_t count) {
  std::vector<uint32_t> values(count, 0);
  for (int rank = 0; rank < world; ++rank) {
    for (uint64_t i = 0; i < count; ++i) values[i] += InputValue(rank, i);
  }
  return ToBytes(values);
}

CallOptions FailureCallOptions(Algorithm algorithm) {
  CallOptions options;
  options.algorithm = algorithm;
  options.timeout = kFailureCallTimeout;
  return options;
}

::testing::AssertionResult AllReduceWorks(
    const std::vector<std::unique_ptr<Communicator>>& ranks, uint64_t count,
    Algorithm algorithm) {
  const int world = static_cast<int>(ranks.size());
  std::vector<std::unique_ptr<BackgroundCall>> calls;
  for (int rank = 0; rank < world; ++rank) {
    calls.push_back(std::make_unique<BackgroundCall>(
        ranks[rank].get(), AllReduceU32(count), RankInputU32(rank, count),
        FailureCallOptions(algorithm)));
  }
  const std::string expected = SumOfInputsU32(world, count);
  ::testing::AssertionResult result = ::testing::AssertionSuccess();
  for (int rank = 0; rank < world; ++rank) {
    calls[rank]->WaitFor(absl::InfiniteDuration());
    if (!calls[rank]->status().ok()) {
      return ::testing::AssertionFailure()
             << "rank " << rank << " of " << ranks[rank]->group() << ": "
             << calls[rank]->status();
    }
    if (calls[rank]->output() != expected) {
      return ::testing::AssertionFailure()
             << "rank " << rank << " of " << ranks[rank]->group()
             << " got a wrong sum (" << calls[rank]->output().size()
             << " bytes)";
    }
    if (algorithm != Algorithm::kUnspecified &&
        calls[rank]->result()->algorithm != algorithm) {
      return ::testing::AssertionFailure()
             << "rank " << rank << " ran "
             << AlgorithmName(calls[rank]->result()->algorithm) << ", not "
             << AlgorithmName(algorithm);
    }
  }
  return result;
}

std::optional<uint64_t> BytesDeliveredTo(pid_t pid, int port) {
  // The socket inodes the process holds.
  absl::flat_hash_set<uint64_t> inodes;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(
           absl::StrCat("/proc/", pid, "/fd"), error)) {
    std::error_code link_error;
    const std::string target =
        std::filesystem::read_symlink(entry.path(), link_error).string();
    absl::string_view rest = target;
    uint64_t inode = 0;
    if (!link_error && absl::ConsumePrefix(&rest, "socket:[") &&
        absl::ConsumeSuffix(&rest, "]") && absl::SimpleAtoi(rest, &inode)) {
      inodes.insert(inode);
    }
  }
  if (error) return std::nullopt;

  const int fd =
      socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
  if (fd < 0) return std::nullopt;
  uint64_t delivered = 0;
  bool ok = true;
  // Loopback connections are IPv4, or IPv4-mapped IPv6 on a dual-stack
  // socket; ask for both.
  for (const uint8_t family : {AF_INET, AF_INET6}) {
    struct {
      nlmsghdr header;
      inet_diag_req_v2 request;
    } message;
    std::memset(&message, 0, sizeof(message));
    message.header.nlmsg_len = sizeof(message);
    message.header.nlmsg_type = SOCK_DIAG_BY_FAMILY;
    message.header.nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP;
    message.request.sdiag_family = family;
    message.request.sdiag_protocol = IPPROTO_TCP;
    message.request.idiag_states = ~0u;
    message.request.idiag_ext = 1 << (INET_DIAG_INFO - 1);
    if (send(fd, &message, sizeof(message), 0) < 0) {
      ok = false;
      break;
    }
    bool done = false;
    std::vector<char> buffer(1 << 16);
    while (ok && !done) {
      const ssize_t received = recv(fd, buffer.data(), buffer.size(), 0);
      if (received <= 0) {
        ok = false;
        break;
      }
      int left = static_cast<int>(received);
      for (const nlmsghdr* header =
               reinterpret_cast<const nlmsghdr*>(buffer.data());
           NLMSG_OK(header, left); header = NLMSG_NEXT(header, left)) {
        if (header->nlmsg_type == NLMSG_DONE) {
          done = true;
          break;
        }
        if (header->nlmsg_type == NLMSG_ERROR) {
          ok = false;
          break;
        }
        const auto* socket_info =
            reinterpret_cast<const inet_diag_msg*>(NLMSG_DATA(header));
        if (ntohs(socket_info->id.idiag_dport) != port ||
            !inodes.contains(socket_info->idiag_inode)) {
          continue;
        }
        int attributes_left = static_cast<int>(
            header->nlmsg_len - NLMSG_LENGTH(sizeof(*socket_info)));
        for (const rtattr* attribute =
                 reinterpret_cast<const rtattr*>(socket_info + 1);
             RTA_OK(attribute, attributes_left);
             attribute = RTA_NEXT(attribute, attributes_left)) {
          if (attribute->rta_type != INET_DIAG_INFO) continue;
          tcp_info info;
          std::memset(&info, 0, sizeof(info));
          std::memcpy(&info, RTA_DATA(attribute),
                      std::min<size_t>(sizeof(info), RTA_PAYLOAD(attribute)));
          delivered += info.tcpi_bytes_acked;
        }
      }
    }
    if (!ok) break;
  }
  close(fd);
  if (!ok) return std::nullopt;
  return delivered;
}

int DataPlanePort(int port) {
  std::unique_ptr<v1::Peer::Stub> stub = v1::Peer::NewStub(
      MakeChannel(absl::StrCat("127.0.0.1:", port), Role::kWorker));
  grpc::ClientContext context;
  context.set_deadline(DeadlineAfter(absl::Seconds(10)));
  v1::DataPlaneInfo info;
  if (!stub->DataPlane(&context, v1::DataPlaneRequest(), &info).ok() ||
      info.tcp_port() == 0) {
    return port;
  }
  return static_cast<int>(info.tcp_port());
}

absl::Status WaitForBytesDelivered(
    pid_t pid, int port, uint64_t bytes,
    const std::vector<std::unique_ptr<BackgroundCall>>& calls,
    absl::Duration timeout) {
  const int data_port = DataPlanePort(port);
  std::optional<uint64_t> delivered;
  int ended = -1;
  const bool reached = WaitUntil(
      [&] {
        for (size_t i = 0; i < calls.size(); ++i) {
          if (calls[i]->done()) ended = static_cast<int>(i);
        }
        if (ended >= 0) return true;
        delivered = BytesDeliveredTo(pid, port);
        if (delivered.has_value() && data_port != port) {
          const std::optional<uint64_t> more = BytesDeliveredTo(pid, data_port);
          delivered = more.has_value() ? *delivered + *more : more;
        }
        return !delivered.has_value() || *delivered >= bytes;
      },
      timeout, absl::Milliseconds(1));
  if (ended >= 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "call ", ended, " ended first: ", calls[ended]->status().ToString()));
  }
  if (!delivered.has_value()) {
    return absl::UnavailableError(
        absl::StrCat("cannot read the TCP statistics of process ", pid));
  }
  if (!reached) {
    return absl::DeadlineExceededError(absl::StrCat(
        "process ", pid, " delivered ", *delivered, " of ", bytes,
        " bytes to port ", port, " within ", absl::FormatDuration(timeout)));
  }
  return absl::OkStatus();
}

}  // namespace chorus::test
