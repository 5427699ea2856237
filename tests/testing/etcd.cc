#include "tests/testing/etcd.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "server/coordinator/election/etcd_client.h"
#include "tests/testing/daemons.h"
#include "tests/testing/wait.h"

namespace chorus::test {

std::string EtcdBinary() {
  const char* path = std::getenv("PATH");
  for (absl::string_view dir : absl::StrSplit(path ? path : "", ':')) {
    const std::string candidate = absl::StrCat(dir, "/etcd");
    if (!dir.empty() && access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

int PickFreePort() {
  // Ports handed out before: a test picks several before any is bound, and
  // the kernel may offer one it just freed again.
  static absl::flat_hash_set<int>& handed_out = *new absl::flat_hash_set<int>();
  for (int attempt = 0; attempt < 100; ++attempt) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof(address);
    int port = 0;
    if (bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0 &&
        getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0) {
      port = ntohs(address.sin_port);
    }
    close(fd);
    if (port > 0 && handed_out.insert(port).second) return port;
  }
  return 0;
}

namespace {

std::string PeerUrl(const Etcd& etcd) {
  return absl::StrCat("http://127.0.0.1:", etcd.peer_port);
}

// Starts the process of member `name` of the cluster `initial_cluster`
// (etcd's --initial-cluster) on `etcd`'s ports and data.
absl::Status StartMember(Etcd& etcd, const std::string& name,
                         const std::string& initial_cluster) {
  const std::string binary = EtcdBinary();
  if (binary.empty()) return absl::NotFoundError("etcd is not installed");
  const std::string client =
      absl::StrCat("http://127.0.0.1:", etcd.client_port);
  SubprocessOptions options;
  options.binary = binary;
  options.args = {absl::StrCat("--name=", name),
                  absl::StrCat("--data-dir=", etcd.data_dir),
                  absl::StrCat("--listen-client-urls=", client),
                  absl::StrCat("--advertise-client-urls=", client),
                  absl::StrCat("--listen-peer-urls=", PeerUrl(etcd)),
                  absl::StrCat("--initial-advertise-peer-urls=", PeerUrl(etcd)),
                  absl::StrCat("--initial-cluster=", initial_cluster)};
  options.stdout_path = NewScratchPath("etcd", ".log");
  absl::StatusOr<std::unique_ptr<Subprocess>> started =
      Subprocess::Start(options);
  if (!started.ok()) return started.status();
  etcd.process = *std::move(started);
  etcd.endpoint = client;
  return absl::OkStatus();
}

// Waits until `etcd` answers a read.
absl::Status WaitForMember(const Etcd& etcd) {
  EtcdOptions client_options;
  client_options.endpoints = {etcd.endpoint};
  client_options.rpc_timeout = absl::Seconds(1);
  // A fresh channel each time: one that tried before etcd listened waits
  // out gRPC's reconnect backoff.
  const bool answers = WaitUntil(
      [&] {
        absl::StatusOr<std::unique_ptr<EtcdClient>> reader =
            EtcdClient::Create(client_options);
        return reader.ok() &&
               absl::IsNotFound((*reader)->Get("/ready").status());
      },
      absl::Seconds(30), absl::Milliseconds(100));
  return answers
             ? absl::OkStatus()
             : absl::DeadlineExceededError("etcd did not answer within 30 s");
}

Etcd NewMember() {
  Etcd etcd;
  etcd.client_port = PickFreePort();
  etcd.peer_port = PickFreePort();
  etcd.data_dir = NewScratchPath("etcd", ".data");
  return etcd;
}

}  // namespace

absl::Status RestartEtcd(Etcd& etcd) {
  absl::Status started = StartMember(
      etcd, "chorus-test", absl::StrCat("chorus-test=", PeerUrl(etcd)));
  return started.ok() ? WaitForMember(etcd) : started;
}

absl::StatusOr<std::vector<Etcd>> StartEtcdCluster(int members) {
  std::vector<Etcd> cluster(members);
  std::vector<std::string> peers;
  for (int i = 0; i < members; ++i) {
    cluster[i] = NewMember();
    peers.push_back(absl::StrCat("m", i, "=", PeerUrl(cluster[i])));
  }
  const std::string initial = absl::StrJoin(peers, ",");
  // Every member first: none answers before a quorum runs.
  for (int i = 0; i < members; ++i) {
    absl::Status started =
        StartMember(cluster[i], absl::StrCat("m", i), initial);
    if (!started.ok()) return started;
  }
  for (const Etcd& member : cluster) {
    absl::Status answers = WaitForMember(member);
    if (!answers.ok()) return answers;
  }
  return cluster;
}

std::string EtcdEndpoints(const std::vector<Etcd>& cluster) {
  std::vector<std::string> endpoints;
  for (const Etcd& member : cluster) endpoints.push_back(member.endpoint);
  return absl::StrJoin(endpoints, ",");
}

absl::StatusOr<Etcd> StartEtcd() {
  Etcd etcd = NewMember();
  absl::Status started = RestartEtcd(etcd);
  if (!started.ok()) return started;
  return etcd;
}

void EtcdTest::SetUp() {
  if (EtcdBinary().empty()) {
    GTEST_SKIP() << "etcd is not installed (scripts/setup.sh installs it)";
  }
  absl::StatusOr<Etcd> etcd = StartEtcd();
  ASSERT_TRUE(etcd.ok()) << etcd.status();
  etcd_ = *std::move(etcd);
}

}  // namespace chorus::test
