// Unit tests of the revocation list (common/revocation.h) with certificates
// and lists made by scripts/dev_certs.sh. Revocation stays on in the
// process once a test turned it on.

#include "common/revocation.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/authorization.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/certs.h"

namespace chorus {
namespace {

using ::testing::HasSubstr;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

class RevocationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    parent_ = ::testing::TempDir() + "/chorus-revocation-XXXXXX";
    ASSERT_NE(mkdtemp(parent_.data()), nullptr);
    absl::StatusOr<std::string> dir =
        test::MakeDevCerts(parent_, {"--workers=w0", "--clients=app"});
    ASSERT_TRUE(dir.ok()) << dir.status();
    dir_ = *dir;
  }
  void TearDown() override {
    std::error_code ignored;
    std::filesystem::remove_all(parent_, ignored);
  }

  std::string parent_;
  std::string dir_;
};

TEST_F(RevocationTest, EnableRevocation_BadFiles_InvalidArgumentAndOff) {
  absl::StatusOr<std::string> other =
      test::MakeDevCerts(parent_, {"--admins=admin"});
  ASSERT_TRUE(other.ok()) << other.status();
  const std::string ca = absl::StrCat(dir_, "/ca.pem");
  const absl::Status foreign =
      EnableRevocation(absl::StrCat(*other, "/crl.pem"), ca, absl::Seconds(10));
  EXPECT_EQ(foreign.code(), absl::StatusCode::kInvalidArgument) << foreign;
  EXPECT_THAT(foreign.message(), HasSubstr("not signed by a CA of"));
  const absl::Status not_a_crl = EnableRevocation(
      absl::StrCat(dir_, "/worker-w0/cert.pem"), ca, absl::Seconds(10));
  EXPECT_EQ(not_a_crl.code(), absl::StatusCode::kInvalidArgument) << not_a_crl;
  EXPECT_THAT(not_a_crl.message(), HasSubstr("holds no PEM certificate"));
  EXPECT_EQ(EnableRevocation(absl::StrCat(dir_, "/missing.pem"), ca,
                             absl::Seconds(10))
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(RevocationEnabled());
}

TEST_F(RevocationTest,
       CheckNotRevoked_CertificateRevokedLater_Unauthenticated) {
  ASSERT_TRUE(EnableRevocation(absl::StrCat(dir_, "/crl.pem"),
                               absl::StrCat(dir_, "/ca.pem"), absl::Hours(1))
                  .ok());
  const std::string cert = absl::StrCat(dir_, "/client-app/cert.pem");
  const std::string id = CertificateIdOfPem(ReadFile(cert));
  ASSERT_FALSE(id.empty());
  const std::string other =
      CertificateIdOfPem(ReadFile(absl::StrCat(dir_, "/worker-w0/cert.pem")));
  EXPECT_NE(id, other);
  EXPECT_TRUE(CheckNotRevoked(id).ok());
  const uint64_t before = RevocationGeneration();
  EXPECT_FALSE(ReloadRevocationsNow());  // nothing changed

  ASSERT_TRUE(test::AddDevCerts(dir_, {absl::StrCat("--revoke=", cert)}).ok());
  ASSERT_TRUE(ReloadRevocationsNow());
  EXPECT_EQ(RevocationGeneration(), before + 1);
  const absl::Status revoked = CheckNotRevoked(id);
  EXPECT_EQ(revoked.code(), absl::StatusCode::kUnauthenticated) << revoked;
  EXPECT_THAT(revoked.message(), HasSubstr("was revoked"));
  EXPECT_TRUE(CheckNotRevoked(other).ok());
  // Every door's check refuses it, whatever the entry.
  Identity client{Role::kClient, "app", ""};
  client.certificate_id = id;
  EXPECT_EQ(Authorize("GET /metrics", client).code(),
            absl::StatusCode::kUnauthenticated);

  // A list that no longer verifies is not taken in: the one in use stays.
  std::ofstream(absl::StrCat(dir_, "/crl.pem")) << "not a list\n";
  EXPECT_FALSE(ReloadRevocationsNow());
  EXPECT_EQ(CheckNotRevoked(id).code(), absl::StatusCode::kUnauthenticated);
}

}  // namespace
}  // namespace chorus
