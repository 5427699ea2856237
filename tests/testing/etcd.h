// Helpers for tests that need etcd: start a one-member etcd on 127.0.0.1
// (Debian's etcd-server, installed by scripts/setup.sh), wait until it
// answers, and start it again on the same ports and data after a kill.
//
// Lifecycle: the returned Etcd owns the process (killed when destroyed);
// its data lives in the test's scratch directory.
// Thread safety: call from the test's main thread.
#ifndef CHORUS_TESTS_TESTING_ETCD_H_
#define CHORUS_TESTS_TESTING_ETCD_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "tests/testing/process.h"

namespace chorus::test {

// The etcd binary on the PATH; "" when etcd is not installed.
std::string EtcdBinary();

// Returns a TCP port on 127.0.0.1 that was free a moment ago and that no
// earlier call in this process returned (0 when none was found).
int PickFreePort();

struct Etcd {
  std::unique_ptr<Subprocess> process;
  // "http://127.0.0.1:<client port>", for --etcd.
  std::string endpoint;
  int client_port = 0;
  int peer_port = 0;
  std::string data_dir;
};

// Starts etcd on free ports and returns once it answers a read. Returns
// NOT_FOUND without etcd, DEADLINE_EXCEEDED when it does not answer within
// 30 s, or Subprocess::Start's errors.
absl::StatusOr<Etcd> StartEtcd();

// Starts `etcd` again (after it was killed) on its ports and data. Errors
// as StartEtcd.
absl::Status RestartEtcd(Etcd& etcd);

// Starts an etcd cluster of `members` members on free ports and returns
// them once each answers a read (a quorum formed). Errors as StartEtcd.
absl::StatusOr<std::vector<Etcd>> StartEtcdCluster(int members);

// The client URLs of `cluster`, comma-separated, for --etcd.
std::string EtcdEndpoints(const std::vector<Etcd>& cluster);

// A test that needs etcd: SetUp() starts one (etcd_), or skips the test
// when etcd is not installed. A subclass's SetUp() calls it first and
// returns when IsSkipped() or a fatal failure says so.
class EtcdTest : public ::testing::Test {
 protected:
  void SetUp() override;

  Etcd etcd_;
};

}  // namespace chorus::test

#endif  // CHORUS_TESTS_TESTING_ETCD_H_
