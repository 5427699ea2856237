#include "server/coordinator/election/election_flags.h"

#include <dirent.h>
#include <fcntl.h>
#include <glog/logging.h>
#include <unistd.h>

#include <cstdlib>
#include <utility>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/metrics.h"

ABSL_FLAG(std::string, etcd, "",
          "etcd endpoints, http(s)://host:port[,...]: run as one of several "
          "coordinators of a cluster, elected on etcd. The leader serves; the "
          "others are standbys that answer every call with UNAVAILABLE naming "
          "the leader and take over when it is gone, with the workers and "
          "groups the leader wrote there (under --etcd_prefix, as membership "
          "changes, never per collective). Empty: this coordinator alone, "
          "state in memory.");
ABSL_FLAG(std::string, etcd_prefix, "/chorus/default",
          "Key prefix of this cluster in etcd: coordinators with the same "
          "prefix elect one leader among them.");
ABSL_FLAG(std::string, etcd_ca, "",
          "PEM file of the CA that signed etcd's certificate (https "
          "endpoints).");
ABSL_FLAG(std::string, etcd_cert, "",
          "PEM certificate this coordinator shows etcd (when etcd asks for "
          "client certificates); with --etcd_key.");
ABSL_FLAG(std::string, etcd_key, "", "PEM key of --etcd_cert.");
ABSL_FLAG(absl::Duration, etcd_lease, absl::ZeroDuration(),
          "TTL of the leader's etcd lease (whole seconds, at most "
          "--lease_timeout): how long the cluster goes without a leader when "
          "the leader dies. 0: --lease_timeout.");
ABSL_FLAG(std::string, advertise, "",
          "Address (host:port) workers and clients use to reach this "
          "coordinator, told to them by standbys. Default: the --listen "
          "address, with this machine's hostname for a wildcard host.");

namespace chorus {
namespace {

absl::Duration LeaseFromFlags(absl::Duration lease_timeout) {
  const absl::Duration lease = absl::GetFlag(FLAGS_etcd_lease);
  return lease == absl::ZeroDuration() ? lease_timeout : lease;
}

std::string AdvertisedAddress(const std::string& listen_host, int port) {
  std::string advertise = absl::GetFlag(FLAGS_advertise);
  if (!advertise.empty()) return advertise;
  std::string host = listen_host;
  if (host.empty() || host == "0.0.0.0" || host == "::" || host == "[::]") {
    char name[256] = {};
    gethostname(name, sizeof(name) - 1);
    host = name;
  }
  if (host.find(':') != std::string::npos && host.front() != '[') {
    host = absl::StrCat("[", host, "]");
  }
  return absl::StrCat(host, ":", port);
}

}  // namespace

absl::Status CheckElectionFlags(absl::Duration lease_timeout) {
  if (absl::GetFlag(FLAGS_etcd).empty()) return absl::OkStatus();
  const absl::Duration lease = LeaseFromFlags(lease_timeout);
  if (lease < absl::Seconds(1) || lease > lease_timeout) {
    return absl::InvalidArgumentError(
        absl::StrCat("--etcd_lease must be between 1s and --lease_timeout (",
                     absl::FormatDuration(lease_timeout), "), not ",
                     absl::FormatDuration(lease)));
  }
  if (absl::GetFlag(FLAGS_etcd_cert).empty() !=
      absl::GetFlag(FLAGS_etcd_key).empty()) {
    return absl::InvalidArgumentError("--etcd_cert and --etcd_key go together");
  }
  const std::string prefix = absl::GetFlag(FLAGS_etcd_prefix);
  if (prefix.empty() || prefix.front() != '/') {
    return absl::InvalidArgumentError(
        "--etcd_prefix must start with '/', e.g. /chorus/prod");
  }
  return absl::OkStatus();
}

absl::StatusOr<Election> ElectionFromFlags(
    absl::Duration lease_timeout,
    std::function<void(const absl::Status& why)> on_deposed) {
  Election started;
  const std::string endpoints = absl::GetFlag(FLAGS_etcd);
  if (endpoints.empty()) return started;
  EtcdOptions etcd;
  etcd.endpoints = absl::StrSplit(endpoints, ',', absl::SkipEmpty());
  etcd.ca_file = absl::GetFlag(FLAGS_etcd_ca);
  etcd.cert_file = absl::GetFlag(FLAGS_etcd_cert);
  etcd.key_file = absl::GetFlag(FLAGS_etcd_key);
  absl::StatusOr<std::unique_ptr<EtcdClient>> client = EtcdClient::Create(etcd);
  if (!client.ok()) return client.status();
  started.etcd = *std::move(client);
  ElectionOptions options;
  std::string prefix = absl::GetFlag(FLAGS_etcd_prefix);
  while (prefix.size() > 1 && prefix.back() == '/') prefix.pop_back();
  options.key = absl::StrCat(prefix, "/leader");
  options.lease = LeaseFromFlags(lease_timeout);
  started.state = std::make_unique<EtcdStateLog>(
      started.etcd.get(), prefix, options.key,
      static_cast<int>(etcd.endpoints.size()), on_deposed);
  started.election = std::make_unique<LeaderElection>(
      started.etcd.get(), options, std::move(on_deposed));
  return started;
}

void StartElection(Election& election, const std::string& listen_host,
                   int port) {
  if (election.election == nullptr) return;
  const std::string address = AdvertisedAddress(listen_host, port);
  LOG(INFO) << "campaigning on etcd " << absl::GetFlag(FLAGS_etcd) << " ("
            << absl::GetFlag(FLAGS_etcd_prefix) << ") as " << address;
  election.election->Start(address);
}

void ExportElectionGauges(const Election* started) {
  const LeaderElection* election = started->election.get();
  const EtcdStateLog* state = started->state.get();
  MetricsRegistry& metrics = DefaultMetrics();
  metrics.Gauge("chorus_coordinator_leading",
                "1 while this coordinator leads the cluster, 0 while it is a "
                "standby (--etcd).",
                {}, [election] {
                  return GaugeSample{{{}, election->Leading() ? 1.0 : 0.0}};
                });
  metrics.Gauge("chorus_coordinator_leader_changes",
                "How many times the leader this coordinator knows changed.", {},
                [election] {
                  return GaugeSample{
                      {{}, static_cast<double>(election->LeaderChanges())}};
                });
  metrics.Gauge(
      "chorus_coordinator_etcd_writes",
      "Writes this coordinator made to etcd (leases, the leader key, "
      "workers and groups as their membership changes); none per "
      "collective.",
      {}, [election, state] {
        return GaugeSample{
            {{},
             static_cast<double>(election->EtcdWrites() + state->Writes())}};
      });
}

void RestartProcess(const std::vector<std::string>& argv) {
  if (DIR* fds = opendir("/proc/self/fd"); fds != nullptr) {
    while (dirent* entry = readdir(fds)) {
      int fd = 0;
      if (absl::SimpleAtoi(entry->d_name, &fd) && fd > 2) {
        fcntl(fd, F_SETFD, FD_CLOEXEC);
      }
    }
    closedir(fds);
  }
  std::vector<char*> args;
  for (const std::string& arg : argv) {
    args.push_back(const_cast<char*>(arg.c_str()));
  }
  args.push_back(nullptr);
  execv("/proc/self/exe", args.data());
  PLOG(ERROR) << "cannot restart " << argv[0];
}

}  // namespace chorus
