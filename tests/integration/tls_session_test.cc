// TlsSession (common/tls_session.h) with both ends in this process:
// bytes moved between a connecting and an accepting session by the test,
// with certificates from scripts/dev_certs.sh. The handshake, the identities
// learned, payloads both ways, a server that is not the role dialed,
// plaintext and a tampered record, and a Seal() too early.

#include "common/tls_session.h"

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/transport_security.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/certs.h"

namespace chorus::test {
namespace {

using ::testing::HasSubstr;

// TLS is the process's: both ends present the coordinator's certificate,
// which names chorus://coordinator.
class TlsSessionTest : public CoordinatorTlsSuite {
 protected:
  // Moves bytes between `client` and `server` until neither has any to
  // send. Returns the first error either end gave.
  static absl::Status Pump(TlsSession& client, TlsSession& server,
                           std::string* to_client_plain,
                           std::string* to_server_plain,
                           std::string client_out = "") {
    absl::Status status = client.Open("", to_client_plain, &client_out);
    for (int round = 0; round < 10 && status.ok(); ++round) {
      std::string server_out;
      status = server.Open(client_out, to_server_plain, &server_out);
      client_out.clear();
      if (status.ok()) {
        status = client.Open(server_out, to_client_plain, &client_out);
      }
      if (server_out.empty() && client_out.empty()) break;
    }
    return status;
  }
};

TEST_F(TlsSessionTest, Handshake_BothEnds_PeersNamedAndPayloadsBothWays) {
  auto client = TlsSession::Connect(Role::kCoordinator);
  auto server = TlsSession::Accept();
  ASSERT_TRUE(client.ok() && server.ok());
  EXPECT_FALSE((*client)->established());
  std::string plain_at_client, plain_at_server;
  ASSERT_TRUE(
      Pump(**client, **server, &plain_at_client, &plain_at_server).ok());
  ASSERT_TRUE((*client)->established());
  ASSERT_TRUE((*server)->established());
  EXPECT_EQ((*client)->peer()->Uri(), "chorus://coordinator");
  EXPECT_EQ((*server)->peer()->Uri(), "chorus://coordinator");

  // 3 MiB takes many records; it arrives whole and in order.
  std::string big(3 << 20, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 7);
  std::string records;
  ASSERT_TRUE((*client)->Seal("hello ", &records).ok());
  ASSERT_TRUE((*client)->Seal(big, &records).ok());
  EXPECT_EQ(records.find("hello"), std::string::npos) << "not encrypted";
  std::string out;
  // Fed in odd pieces, as a socket would give them.
  for (size_t at = 0; at < records.size(); at += 10007) {
    ASSERT_TRUE((*server)
                    ->Open(absl::string_view(records).substr(at, 10007),
                           &plain_at_server, &out)
                    .ok());
  }
  EXPECT_EQ(plain_at_server, "hello " + big);

  std::string reply;
  ASSERT_TRUE((*server)->Seal("verdict", &reply).ok());
  ASSERT_TRUE((*client)->Open(reply, &plain_at_client, nullptr).ok());
  EXPECT_EQ(plain_at_client, "verdict");
}

TEST_F(TlsSessionTest, Connect_ServerNotTheRoleDialed_Unavailable) {
  auto client = TlsSession::Connect(Role::kWorker);
  auto server = TlsSession::Accept();
  ASSERT_TRUE(client.ok() && server.ok());
  std::string plain;
  const absl::Status status = Pump(**client, **server, &plain, &plain);
  EXPECT_TRUE(absl::IsUnavailable(status)) << status;
  EXPECT_THAT(status.message(),
              HasSubstr("names chorus://coordinator, not a worker"));
  EXPECT_FALSE((*client)->established());
  // The session stays failed.
  std::string out;
  EXPECT_TRUE(absl::IsUnavailable((*client)->Seal("x", &out)));
}

TEST_F(TlsSessionTest, Open_Plaintext_UnavailableAndNothingDecrypted) {
  auto server = TlsSession::Accept();
  ASSERT_TRUE(server.ok());
  std::string plain, out;
  const absl::Status status =
      (*server)->Open("CHORUS-CALL/1\nplaintext frame", &plain, &out);
  EXPECT_TRUE(absl::IsUnavailable(status)) << status;
  EXPECT_THAT(status.message(), HasSubstr("TLS handshake failed"));
  EXPECT_TRUE(plain.empty());
  EXPECT_FALSE((*server)->established());
}

TEST_F(TlsSessionTest, Open_TamperedRecord_Unavailable) {
  auto client = TlsSession::Connect(Role::kCoordinator);
  auto server = TlsSession::Accept();
  ASSERT_TRUE(client.ok() && server.ok());
  std::string plain_at_client, plain_at_server;
  ASSERT_TRUE(
      Pump(**client, **server, &plain_at_client, &plain_at_server).ok());
  std::string records;
  ASSERT_TRUE((*client)->Seal("rank 1 sends 42", &records).ok());
  records[records.size() - 3] ^= 0x01;
  std::string out;
  EXPECT_TRUE(
      absl::IsUnavailable((*server)->Open(records, &plain_at_server, &out)));
  EXPECT_TRUE(plain_at_server.empty());
}

TEST_F(TlsSessionTest, Seal_BeforeHandshake_FailedPrecondition) {
  auto client = TlsSession::Connect(Role::kCoordinator);
  ASSERT_TRUE(client.ok());
  std::string out;
  EXPECT_TRUE(absl::IsFailedPrecondition((*client)->Seal("early", &out)));
}

}  // namespace
}  // namespace chorus::test
