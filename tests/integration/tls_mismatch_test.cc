// A client and a coordinator that disagree about TLS (common/
// tls_mismatch.h): chorusctl or a worker without --tls_dir against a
// coordinator with mutual TLS learns that it needs --tls_dir (it used to get
// gRPC's bare "Socket closed", and the worker retried for ever), and one
// with --tls_dir against a plaintext coordinator learns that the
// coordinator does not use TLS. The probe behind it answers true only for a
// TLS server. Real daemons on 127.0.0.1; this process runs in plaintext.

#include "common/tls_mismatch.h"

#include <sys/socket.h>

#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/tcp_socket.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/certs.h"
#include "tests/testing/daemons.h"

namespace chorus::test {
namespace {

using ::testing::HasSubstr;

// Bound on a refusal that needs one connection and the probe's second.
constexpr absl::Duration kPromptBound = absl::Seconds(5);

class TlsMismatchTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    absl::StatusOr<std::string> made =
        MakeDevCerts(ScratchDir(), {"--workers=w0", "--admins=admin"});
    ASSERT_TRUE(made.ok()) << made.status();
    certs_ = new std::string(*made);
  }
  static void TearDownTestSuite() {
    delete certs_;
    certs_ = nullptr;
  }

  static std::string TlsDir(const std::string& identity) {
    return absl::StrCat("--tls_dir=", *certs_, "/", identity);
  }

  static std::string* certs_;
};

std::string* TlsMismatchTest::certs_ = nullptr;

TEST_F(TlsMismatchTest, Chorusctl_PlaintextToTlsCoordinator_SaysGiveTlsDir) {
  absl::StatusOr<Daemon> coordinator =
      StartCoordinator({TlsDir("coordinator")});
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  const absl::Time start = absl::Now();
  absl::StatusOr<CommandResult> ran =
      RunChorusctl({absl::StrCat("--coordinator=", coordinator->address),
                    "--timeout=10s", "workers"});
  ASSERT_TRUE(ran.ok()) << ran.status();
  EXPECT_LE(absl::Now() - start, kPromptBound);
  EXPECT_EQ(ran->exit_code, 1);
  EXPECT_THAT(ran->err,
              HasSubstr(absl::StrCat("FAILED_PRECONDITION: the coordinator at ",
                                     coordinator->address,
                                     " uses mutual TLS and this process has "
                                     "no certificates: give it --tls_dir=DIR")))
      << ran->err;
  EXPECT_THAT(ran->err, ::testing::Not(HasSubstr("Socket closed")));
}

TEST_F(TlsMismatchTest,
       Worker_PlaintextToTlsCoordinator_ExitsSayingGiveTlsDir) {
  absl::StatusOr<Daemon> coordinator =
      StartCoordinator({TlsDir("coordinator")});
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  absl::StatusOr<std::unique_ptr<Subprocess>> worker =
      SpawnWorker(coordinator->address, {"--name=w0"});
  ASSERT_TRUE(worker.ok()) << worker.status();
  absl::StatusOr<int> code = (*worker)->WaitForExit(kPromptBound);
  ASSERT_TRUE(code.ok()) << "the worker still runs: " << code.status();
  EXPECT_NE(*code, 0);
  EXPECT_THAT(
      (*worker)->ReadLog(),
      HasSubstr(absl::StrCat("the coordinator at ", coordinator->address,
                             " uses mutual TLS and this process has "
                             "no certificates")));
}

TEST_F(TlsMismatchTest, Chorusctl_TlsToPlaintextCoordinator_SaysItHasNoTls) {
  absl::StatusOr<Daemon> coordinator = StartCoordinator();
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  absl::StatusOr<CommandResult> ran =
      RunChorusctl({absl::StrCat("--coordinator=", coordinator->address),
                    "--timeout=10s", TlsDir("admin-admin"), "workers"});
  ASSERT_TRUE(ran.ok()) << ran.status();
  EXPECT_EQ(ran->exit_code, 1);
  EXPECT_THAT(ran->err,
              HasSubstr(absl::StrCat("FAILED_PRECONDITION: the coordinator at ",
                                     coordinator->address,
                                     " does not use TLS (it runs without "
                                     "--tls_dir) and this process does")))
      << ran->err;
}

TEST_F(TlsMismatchTest, ServerSpeaksTls_TlsPlaintextOrNoServer_OnlyTlsTrue) {
  absl::StatusOr<Daemon> tls = StartCoordinator({TlsDir("coordinator")});
  ASSERT_TRUE(tls.ok()) << tls.status();
  absl::StatusOr<Daemon> plaintext = StartCoordinator();
  ASSERT_TRUE(plaintext.ok()) << plaintext.status();
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  EXPECT_TRUE(ServerSpeaksTls("127.0.0.1", tls->port, deadline));
  EXPECT_FALSE(ServerSpeaksTls("127.0.0.1", plaintext->port, deadline));

  // A listener that accepts and closes at once, and a port nobody serves.
  absl::StatusOr<Listener> listener = ListenTcp("127.0.0.1", 0);
  ASSERT_TRUE(listener.ok()) << listener.status();
  std::thread closer([fd = listener->fd] {
    const int accepted = accept(fd, nullptr, nullptr);
    if (accepted >= 0) CloseSocket(accepted);
  });
  EXPECT_FALSE(ServerSpeaksTls("127.0.0.1", listener->port, deadline));
  closer.join();
  CloseSocket(listener->fd);
  EXPECT_FALSE(ServerSpeaksTls("127.0.0.1", listener->port, deadline));
}

TEST_F(TlsMismatchTest, ExplainTlsMismatch_OtherStatusOrUnixTarget_Unchanged) {
  const absl::Status refused = absl::UnavailableError("Connection refused");
  EXPECT_EQ(ExplainTlsMismatch(refused, "unix:/nowhere", Role::kWorker),
            refused);
  const absl::Status denied = absl::PermissionDeniedError("no");
  EXPECT_EQ(ExplainTlsMismatch(denied, "127.0.0.1:1", Role::kCoordinator),
            denied);
}

}  // namespace
}  // namespace chorus::test
