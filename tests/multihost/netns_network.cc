#include "tests/multihost/netns_network.h"

#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "tests/testing/daemons.h"

namespace chorus::test {
namespace {

// Every namespace of every test process starts with this, then the pid.
constexpr char kPrefix[] = "chorus-mh-";
// The bridge, inside the bridge namespace.
constexpr char kBridge[] = "br0";
// How long one `ip` command may take on a loaded machine.
constexpr absl::Duration kIpTimeout = absl::Seconds(30);

// The path of iproute2's `tool` (ip, tc): on the PATH, else where Debian
// installs it (a PATH without the sbin folders is common outside a login
// shell); "" when there is none.
std::string ToolBinary(absl::string_view tool) {
  std::vector<std::string> dirs = absl::StrSplit(
      getenv("PATH") ? getenv("PATH") : "", ':', absl::SkipEmpty());
  dirs.push_back("/usr/sbin");
  dirs.push_back("/sbin");
  for (const std::string& dir : dirs) {
    const std::string candidate = absl::StrCat(dir, "/", tool);
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

std::string IpBinary() { return ToolBinary("ip"); }

// The bridge port of host `i`.
std::string PortName(int i) { return absl::StrCat("p", i); }

// Runs iproute2's `tool` and returns its stdout.
absl::StatusOr<std::string> ToolOutput(absl::string_view tool,
                                       const std::vector<std::string>& args) {
  const std::string binary = ToolBinary(tool);
  if (binary.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("no `", tool, "` command (Debian: iproute2)"));
  }
  absl::StatusOr<CommandResult> result = RunCommand(binary, args, kIpTimeout);
  const std::string command = absl::StrCat(tool, " ", absl::StrJoin(args, " "));
  if (!result.ok()) {
    return absl::InternalError(
        absl::StrCat(command, ": ", result.status().ToString()));
  }
  if (result->exit_code != 0) {
    return absl::InternalError(absl::StrCat(command, " exited with ",
                                            result->exit_code, ": ",
                                            result->err, result->out));
  }
  return result->out;
}

absl::StatusOr<std::string> IpOutput(const std::vector<std::string>& args) {
  return ToolOutput("ip", args);
}

// Deletes the namespaces of test processes that are gone.
void SweepStaleNamespaces() {
  absl::StatusOr<std::string> list = IpOutput({"netns", "list"});
  if (!list.ok()) return;
  for (absl::string_view line : absl::StrSplit(*list, '\n')) {
    // "name" or "name (id: 3)".
    const absl::string_view name = line.substr(0, line.find(' '));
    absl::string_view rest = name;
    if (!absl::ConsumePrefix(&rest, kPrefix)) continue;
    int pid = 0;
    if (!absl::SimpleAtoi(rest.substr(0, rest.find('-')), &pid) || pid <= 0) {
      continue;
    }
    if (kill(pid, 0) == 0 || errno != ESRCH) continue;  // still running
    RunIp({"netns", "delete", std::string(name)}).IgnoreError();
  }
}

}  // namespace

absl::Status RunIp(const std::vector<std::string>& args) {
  return IpOutput(args).status();
}

absl::Status NamespaceNetwork::CheckSupported() {
  if (geteuid() != 0) {
    return absl::FailedPreconditionError(
        "the multi-host tests make network namespaces, which needs root");
  }
  if (IpBinary().empty()) {
    return absl::FailedPreconditionError(
        "the multi-host tests need the `ip` command (Debian: iproute2)");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<NamespaceNetwork>> NamespaceNetwork::Create(
    int hosts) {
  if (absl::Status supported = CheckSupported(); !supported.ok()) {
    return supported;
  }
  if (hosts < 1 || hosts > 200) {
    return absl::InvalidArgumentError(
        absl::StrCat(hosts, " hosts: want 1 to 200"));
  }
  SweepStaleNamespaces();
  static int networks = 0;
  std::unique_ptr<NamespaceNetwork> net(
      new NamespaceNetwork(absl::StrCat(kPrefix, getpid(), "-", networks++)));
  const std::string bridge_ns = net->BridgeNamespace();
  absl::Status made = RunIp({"netns", "add", bridge_ns});
  if (!made.ok()) {
    // The first namespace says whether this machine allows them at all.
    return absl::FailedPreconditionError(
        absl::StrCat("cannot make a network namespace here: ", made.message()));
  }
  net->made_.push_back(bridge_ns);
  for (const std::vector<std::string>& args :
       std::vector<std::vector<std::string>>{
           {"-n", bridge_ns, "link", "add", kBridge, "type", "bridge"},
           {"-n", bridge_ns, "link", "set", kBridge, "up"}}) {
    if (absl::Status s = RunIp(args); !s.ok()) return s;
  }
  for (int i = 0; i < hosts; ++i) {
    const std::string host = absl::StrCat(net->prefix_, "-h", i);
    if (absl::Status s = RunIp({"netns", "add", host}); !s.ok()) return s;
    net->made_.push_back(host);
    net->names_.push_back(host);
    const std::string port = PortName(i);
    for (const std::vector<std::string>& args :
         std::vector<std::vector<std::string>>{
             {"-n", host, "link", "set", "lo", "up"},
             {"-n", bridge_ns, "link", "add", port, "type", "veth", "peer",
              "name", NamespaceNetwork::kInterface, "netns", host},
             {"-n", bridge_ns, "link", "set", port, "master", kBridge},
             {"-n", bridge_ns, "link", "set", port, "up"},
             {"-n", host, "addr", "add", absl::StrCat(net->address(i), "/24"),
              "dev", NamespaceNetwork::kInterface},
             {"-n", host, "link", "set", NamespaceNetwork::kInterface, "up"}}) {
      if (absl::Status s = RunIp(args); !s.ok()) return s;
    }
  }
  return net;
}

NamespaceNetwork::~NamespaceNetwork() {
  for (auto it = made_.rbegin(); it != made_.rend(); ++it) {
    RunIp({"netns", "delete", *it}).IgnoreError();
  }
}

std::string NamespaceNetwork::address(int i) const {
  return absl::StrCat("10.77.0.", i + 1);
}

std::vector<std::string> NamespaceNetwork::Wrap(int i) const {
  return {IpBinary(), "netns", "exec", names_[i]};
}

absl::Status NamespaceNetwork::SetConnected(int i, bool connected) {
  return RunIp({"-n", BridgeNamespace(), "link", "set", PortName(i),
                connected ? "up" : "down"});
}

absl::StatusOr<std::string> NamespaceNetwork::Tc(
    int i, const std::vector<std::string>& args) {
  std::vector<std::string> command = {"-n", names_[i]};
  command.insert(command.end(), args.begin(), args.end());
  return ToolOutput("tc", command);
}

std::string NamespaceNetwork::BridgeNamespace() const {
  return absl::StrCat(prefix_, "-br");
}

}  // namespace chorus::test
