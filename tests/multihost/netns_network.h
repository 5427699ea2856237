// NamespaceNetwork: a small network of Linux network namespaces for the
// multi-host tests, so that each Chorus daemon runs on a "host" of its own:
// its own loopback, its own address and no route to the others except over
// a bridge. Host i is the namespace "<prefix>-h<i>" with lo up and one veth,
// eth0, addressed 10.77.0.<i+1>/24; the other ends of the veths are ports of
// a bridge in a namespace of its own ("<prefix>-br"), so no address or link
// is added to the namespace the test runs in. The prefix holds the test
// process's pid, so concurrent test processes never share a network.
//
// Lifecycle: Create() first removes the namespaces left behind by earlier
// test processes that are gone (their pid is in the name), then builds the
// network; the destructor deletes every namespace it made (the veths and
// the bridge go with them), also when the test failed. Processes still
// running in a namespace keep it alive until they exit, so tests destroy
// their daemons first (declare the network before them).
//
// Thread safety: thread-compatible; use from the test's main thread.
#ifndef CHORUS_TESTS_MULTIHOST_NETNS_NETWORK_H_
#define CHORUS_TESTS_MULTIHOST_NETNS_NETWORK_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace chorus::test {

class NamespaceNetwork {
 public:
  // Returns OK when this process can make network namespaces (it is root
  // and `ip` is installed), else FAILED_PRECONDITION saying why: the text
  // for GTEST_SKIP.
  static absl::Status CheckSupported();

  // Builds a network of `hosts` hosts (1 to 200). Returns
  // FAILED_PRECONDITION as CheckSupported, or INTERNAL quoting the `ip`
  // command that failed (after removing what it had made).
  static absl::StatusOr<std::unique_ptr<NamespaceNetwork>> Create(int hosts);

  // Deletes every namespace this network made.
  ~NamespaceNetwork();

  NamespaceNetwork(const NamespaceNetwork&) = delete;
  NamespaceNetwork& operator=(const NamespaceNetwork&) = delete;

  int hosts() const { return static_cast<int>(names_.size()); }
  // The namespace of host `i`.
  const std::string& name(int i) const { return names_[i]; }
  // The address of host `i` on the bridge, "10.77.0.<i+1>".
  std::string address(int i) const;
  // The command prefix that runs a program on host `i`:
  // {"<path of ip>", "netns", "exec", name(i)}. `ip netns exec` execs the
  // program, so the process started is the program itself (signals reach
  // it directly).
  std::vector<std::string> Wrap(int i) const;

  // Takes host `i`'s port on the bridge down (`connected` false: its
  // packets go nowhere and nothing tells either side, as when a cable is
  // cut) or up again. Returns INTERNAL quoting the failed command.
  absl::Status SetConnected(int i, bool connected);

  // Runs `tc -n <name(i)> args...` (e.g. {"qdisc", "replace", "dev", "eth0",
  // "root", "tbf", ...} to shape host `i`'s link) and returns what it
  // printed. Returns FAILED_PRECONDITION without `tc`, INTERNAL quoting the
  // command when it fails (for a qdisc the kernel lacks: "Specified qdisc
  // kind is unknown").
  absl::StatusOr<std::string> Tc(int i, const std::vector<std::string>& args);

  // The interface of every host on the bridge.
  static constexpr char kInterface[] = "eth0";

 private:
  explicit NamespaceNetwork(std::string prefix) : prefix_(std::move(prefix)) {}

  // The namespace holding the bridge.
  std::string BridgeNamespace() const;

  const std::string prefix_;
  std::vector<std::string> names_;
  // Every namespace made so far, deleted by the destructor.
  std::vector<std::string> made_;
};

// Runs `ip` with `args` to completion. Returns OK when it exits 0, else
// INTERNAL quoting the command and what it printed.
absl::Status RunIp(const std::vector<std::string>& args);

}  // namespace chorus::test

#endif  // CHORUS_TESTS_MULTIHOST_NETNS_NETWORK_H_
