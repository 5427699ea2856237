// chorusctl: the command line client of a Chorus cluster.

#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "chorus/admin_client.h"
#include "server/common/device_proto.h"

ABSL_FLAG(std::string, coordinator, "127.0.0.1:7000",
          "Address of chorus-coordinator, host:port.");
ABSL_FLAG(absl::Duration, timeout, absl::Seconds(10), "Deadline of each call.");

namespace {

constexpr char kUsage[] =
    "chorusctl: inspect and use a Chorus cluster.\n"
    "Usage: chorusctl [--coordinator=HOST:PORT] [--timeout=10s] COMMAND\n"
    "Commands:\n"
    "  workers   list registered workers: id, name, host, address,\n"
    "            incarnation, lease age and devices";

std::string Devices(const chorus::v1::WorkerInfo& worker) {
  return absl::StrJoin(
      worker.devices(), ",", [](std::string* out, const chorus::v1::Device& d) {
        out->append(chorus::CanonicalName(chorus::DeviceFromProto(d)));
      });
}

int ListWorkers(const chorus::AdminClient& client) {
  absl::StatusOr<std::vector<chorus::v1::WorkerInfo>> workers =
      client.ListWorkers();
  if (!workers.ok()) {
    std::cerr << "chorusctl: " << workers.status() << std::endl;
    return 1;
  }
  std::cout << absl::StrFormat("%-4s %-24s %-16s %-22s %-20s %-9s %s\n", "ID",
                               "NAME", "HOST", "ADDRESS", "INCARNATION",
                               "LEASE_AGE", "DEVICES");
  for (const chorus::v1::WorkerInfo& w : *workers) {
    std::cout << absl::StrFormat(
        "%-4d %-24s %-16s %-22s %-20d %-9s %s\n", w.worker_id(), w.name(),
        w.host(), w.address(), w.incarnation(),
        absl::StrCat(w.lease_age_ms(), "ms"), Devices(w));
  }
  std::cout << workers->size() << " worker" << (workers->size() == 1 ? "" : "s")
            << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(kUsage);
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() != 2) {
    std::cerr << kUsage << std::endl;
    return 2;
  }
  const std::string command = args[1];
  std::unique_ptr<chorus::AdminClient> client = chorus::AdminClient::Connect(
      absl::GetFlag(FLAGS_coordinator), absl::GetFlag(FLAGS_timeout));
  if (command == "workers") return ListWorkers(*client);
  std::cerr << "chorusctl: unknown command \"" << command << "\"\n"
            << kUsage << std::endl;
  return 2;
}
