// Unit tests of the identity names and the secure-by-default rule of
// transport_security.h (no TLS is turned on in this process).

#include "common/transport_security.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace chorus {
namespace {

using ::testing::HasSubstr;

TEST(ParseIdentityUriTest, EveryRole_ParsedAndPrintedBack) {
  for (const char* uri :
       {"chorus://coordinator", "chorus://worker/node-1",
        "chorus://admin/alice", "chorus://client/trainer.3",
        "chorus://job/train-7/worker/w0", "chorus://job/a/client/c_1"}) {
    absl::StatusOr<Identity> identity = ParseIdentityUri(uri);
    ASSERT_TRUE(identity.ok()) << uri << ": " << identity.status();
    EXPECT_EQ(identity->Uri(), uri);
  }
  absl::StatusOr<Identity> worker = ParseIdentityUri("chorus://worker/w0");
  ASSERT_TRUE(worker.ok());
  EXPECT_EQ(worker->role, Role::kWorker);
  EXPECT_EQ(worker->name, "w0");
  EXPECT_EQ(worker->job, "");
}

TEST(ParseIdentityUriTest, JobWorker_JobAndNameApart) {
  absl::StatusOr<Identity> worker =
      ParseIdentityUri("chorus://job/blue/worker/w0");
  ASSERT_TRUE(worker.ok()) << worker.status();
  EXPECT_EQ(worker->role, Role::kWorker);
  EXPECT_EQ(worker->name, "w0");
  EXPECT_EQ(worker->job, "blue");
}

TEST(ParseIdentityUriTest, MalformedUris_InvalidArgument) {
  for (const char* uri :
       {"", "chorus://", "chorus://worker/", "chorus://worker",
        "chorus://worker/a/b", "chorus://root/x", "spiffe://chorus/worker/w0",
        "https://example.com", "chorus://coordinator/extra",
        "CHORUS://worker/w0", "chorus://job/blue/admin/a",
        "chorus://job//worker/w0", "chorus://job/blue/coordinator",
        "chorus://job/blue", "chorus://job/b c/worker/w0",
        "chorus://worker/w 0", "chorus://job/blue/worker/a/b"}) {
    absl::StatusOr<Identity> identity = ParseIdentityUri(uri);
    EXPECT_EQ(identity.status().code(), absl::StatusCode::kInvalidArgument)
        << "'" << uri << "'";
  }
}

TEST(CheckPlaintextListenTest, LoopbackWithoutTls_Ok) {
  EXPECT_FALSE(TlsEnabled());
  for (const char* host : {"127.0.0.1", "127.0.1.1", "::1", "localhost"}) {
    EXPECT_TRUE(CheckPlaintextListen("--listen", host, false).ok()) << host;
  }
}

TEST(CheckPlaintextListenTest, NetworkHostWithoutTls_FailedPrecondition) {
  for (const char* host : {"0.0.0.0", "::", "", "10.0.0.1"}) {
    const absl::Status status = CheckPlaintextListen("--listen", host, false);
    EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << host;
    EXPECT_THAT(std::string(status.message()),
                HasSubstr("give --tls_dir (scripts/dev_certs.sh makes"));
    EXPECT_THAT(std::string(status.message()), HasSubstr("--insecure"));
  }
}

TEST(CheckPlaintextListenTest, NetworkHostInsecure_Ok) {
  EXPECT_TRUE(CheckPlaintextListen("--listen", "0.0.0.0", true).ok());
}

}  // namespace
}  // namespace chorus
