// Revocation (--tls_crl) with real daemons: a chorus-coordinator and two
// chorus-workers given the CA's revocation list, which the test changes
// with scripts/dev_certs.sh --revoke while they run. A revoked certificate
// is refused on a connection already open (its next call) and on new ones,
// by every daemon; other certificates go on, and nothing changes.

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "chorus/v1/coordinator.grpc.pb.h"
#include "chorus/v1/worker.grpc.pb.h"
#include "common/net.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/certs.h"
#include "tests/testing/daemons.h"
#include "tests/testing/wait.h"

namespace chorus::test {
namespace {

using ::testing::HasSubstr;

std::shared_ptr<grpc::Channel> ChannelAs(const std::string& address,
                                         const std::string& tls_dir) {
  const PemFiles pem = ReadPemFiles(tls_dir);
  grpc::SslCredentialsOptions options;
  options.pem_root_certs = pem.ca;
  options.pem_cert_chain = pem.cert;
  options.pem_private_key = pem.key;
  return grpc::CreateChannel(address, grpc::SslCredentials(options));
}

std::unique_ptr<grpc::ClientContext> Context() {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(DeadlineAfter(kRpcTimeout));
  return context;
}

class RevocationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    parent_ = ::testing::TempDir() + "/chorus-revocation-XXXXXX";
    ASSERT_NE(mkdtemp(parent_.data()), nullptr);
    absl::StatusOr<std::string> dir = MakeDevCerts(
        parent_, {"--workers=w0,w1", "--admins=admin", "--clients=app"});
    ASSERT_TRUE(dir.ok()) << dir.status();
    dir_ = *dir;
    const std::vector<std::string> tls = {
        absl::StrCat("--tls_crl=", dir_, "/crl.pem"), "--tls_refresh=200ms"};
    std::vector<std::string> flags = tls;
    flags.push_back(absl::StrCat("--tls_dir=", dir_, "/coordinator"));
    flags.push_back("--lease_timeout=60s");
    absl::StatusOr<Daemon> coordinator = StartCoordinator(flags);
    ASSERT_TRUE(coordinator.ok()) << coordinator.status();
    coordinator_ = *std::move(coordinator);
    for (const std::string name : {"w0", "w1"}) {
      flags = tls;
      flags.push_back(absl::StrCat("--tls_dir=", dir_, "/worker-", name));
      absl::StatusOr<Daemon> worker = StartWorker(coordinator_.address, flags);
      ASSERT_TRUE(worker.ok()) << worker.status();
      workers_.push_back(*std::move(worker));
    }
    registry_ = Registry();
    ASSERT_EQ(registry_.size(), 2u);
  }

  void TearDown() override {
    workers_.clear();
    std::error_code ignored;
    std::filesystem::remove_all(parent_, ignored);
  }

  std::string TlsDir(const std::string& who) const {
    return absl::StrCat(dir_, "/", who);
  }

  void Revoke(const std::string& who) {
    ASSERT_TRUE(
        AddDevCerts(dir_, {absl::StrCat("--revoke=", TlsDir(who), "/cert.pem")})
            .ok());
  }

  // "name id" per registered worker, as the admin lists them.
  std::vector<std::string> Registry() const {
    v1::ListWorkersResponse response;
    const grpc::Status status =
        v1::Coordinator::NewStub(
            ChannelAs(coordinator_.address, TlsDir("admin-admin")))
            ->ListWorkers(Context().get(), v1::ListWorkersRequest(), &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    std::vector<std::string> lines;
    for (const v1::WorkerInfo& w : response.workers()) {
      lines.push_back(absl::StrCat(w.name(), " ", w.worker_id()));
    }
    return lines;
  }

  std::string parent_;
  std::string dir_;
  Daemon coordinator_;
  std::vector<Daemon> workers_;
  std::vector<std::string> registry_;
};

// A one-rank join through the local API of `stub`.
grpc::Status JoinSolo(v1::WorkerLocal::Stub& stub) {
  v1::LocalJoinRequest join;
  join.set_group("solo");
  join.set_world_size(1);
  v1::LocalJoinResponse response;
  return stub.JoinGroup(Context().get(), join, &response);
}

TEST_F(RevocationTest, Client_RevokedWhileConnected_OpenAndNewRefused) {
  auto open = v1::WorkerLocal::NewStub(
      ChannelAs(workers_[0].address, TlsDir("client-app")));
  ASSERT_TRUE(JoinSolo(*open).ok());

  Revoke("client-app");
  grpc::Status refused;
  ASSERT_TRUE(WaitUntil(
      [&] {
        refused = JoinSolo(*open);
        return !refused.ok();
      },
      kRpcTimeout));
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(refused.error_message(), HasSubstr("was revoked"));
  auto fresh = v1::WorkerLocal::NewStub(
      ChannelAs(workers_[0].address, TlsDir("client-app")));
  EXPECT_EQ(JoinSolo(*fresh).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  // The admin goes on; nothing changed.
  auto admin = v1::WorkerLocal::NewStub(
      ChannelAs(workers_[0].address, TlsDir("admin-admin")));
  EXPECT_TRUE(JoinSolo(*admin).ok());
  EXPECT_EQ(Registry(), registry_);
}

TEST_F(RevocationTest, Worker_Revoked_CoordinatorAndPeersRefuseIt) {
  Revoke("worker-w1");
  const uint64_t w1 = std::stoull(registry_[1].substr(3));
  auto as_w1 = v1::Coordinator::NewStub(
      ChannelAs(coordinator_.address, TlsDir("worker-w1")));
  v1::HeartbeatRequest heartbeat;
  heartbeat.set_worker_id(w1);
  heartbeat.set_incarnation(1);
  grpc::Status beat;
  ASSERT_TRUE(WaitUntil(
      [&] {
        v1::HeartbeatResponse response;
        beat = as_w1->Heartbeat(Context().get(), heartbeat, &response);
        return beat.error_code() == grpc::StatusCode::UNAUTHENTICATED;
      },
      kRpcTimeout))
      << beat.error_message();
  EXPECT_THAT(beat.error_message(), HasSubstr("was revoked"));
  grpc::Status peer;
  ASSERT_TRUE(WaitUntil(
      [&] {
        v1::DataPlaneInfo info;
        peer = v1::Peer::NewStub(
                   ChannelAs(workers_[0].address, TlsDir("worker-w1")))
                   ->DataPlane(Context().get(), v1::DataPlaneRequest(), &info);
        return peer.error_code() == grpc::StatusCode::UNAUTHENTICATED;
      },
      kRpcTimeout))
      << peer.error_message();
  // w0 is not refused.
  v1::DataPlaneInfo info;
  EXPECT_TRUE(
      v1::Peer::NewStub(ChannelAs(workers_[1].address, TlsDir("worker-w0")))
          ->DataPlane(Context().get(), v1::DataPlaneRequest(), &info)
          .ok());
}

}  // namespace
}  // namespace chorus::test
