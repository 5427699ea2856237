// Integration tests of mutual TLS and identities: a real chorus-coordinator
// and two chorus-workers on 127.0.0.1 with certificates from
// scripts/dev_certs.sh, attacked through gRPC channels holding other
// certificates (or none). Each attack gets its code and changes nothing: the
// registry and the group are checked afterwards.

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "chorus/v1/coordinator.grpc.pb.h"
#include "chorus/v1/worker.grpc.pb.h"
#include "common/call_frame.h"
#include "common/collective_spec_proto.h"
#include "common/grpc_status.h"
#include "common/net.h"
#include "common/tcp_socket.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/worker/dataplane/wire_frame.h"
#include "tests/testing/certs.h"
#include "tests/testing/daemons.h"
#include "tests/testing/local_calls.h"
#include "tests/testing/raw_clients.h"
#include "tests/testing/wait.h"

namespace chorus::test {
namespace {

using ::testing::HasSubstr;

// Certificates shared by every test: made once, they take seconds.
struct Certs {
  std::string dir;        // CA, coordinator, workers w0-w2, admin, client app
  std::string other_dir;  // another CA: admin, worker w0
  std::string expired;    // an expired worker w0 certificate of dir's CA
};
Certs* certs = nullptr;

std::string TlsDir(const std::string& name) {
  return absl::StrCat(certs->dir, "/", name);
}

// A channel to `address` presenting `pem` (no client certificate when its
// cert is empty); nullopt pem: plaintext.
std::shared_ptr<grpc::Channel> ChannelAs(const std::string& address,
                                         const std::optional<PemFiles>& pem) {
  if (!pem.has_value()) {
    return grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  }
  grpc::SslCredentialsOptions options;
  options.pem_root_certs = pem->ca;
  options.pem_cert_chain = pem->cert;
  options.pem_private_key = pem->key;
  return grpc::CreateChannel(address, grpc::SslCredentials(options));
}

// A registration of a worker named "w1".
v1::RegisterWorkerRequest RegistrationAsW1() {
  v1::RegisterWorkerRequest request;
  request.set_name("w1");
  request.set_address("127.0.0.1:1");
  request.set_incarnation(1);
  request.add_devices()->set_kind(v1::DEVICE_KIND_CPU);
  return request;
}

// all_reduce sum of one i64.
CollectiveSpec SumOfOneI64() {
  CollectiveSpec spec;
  spec.kind = CollectiveKind::kAllReduce;
  spec.dtype = DType::kI64;
  spec.count = 1;
  spec.op = ReduceOp::kSum;
  return spec;
}

std::unique_ptr<grpc::ClientContext> Context() {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(DeadlineAfter(kRpcTimeout));
  return context;
}

class TlsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::string parent = ::testing::TempDir() + "/chorus-tls-certs-XXXXXX";
    ASSERT_NE(mkdtemp(parent.data()), nullptr);
    certs = new Certs;
    absl::StatusOr<std::string> dir = MakeDevCerts(
        parent, {"--workers=w0,w1,w2", "--admins=admin", "--clients=app"});
    ASSERT_TRUE(dir.ok()) << dir.status();
    certs->dir = *dir;
    absl::StatusOr<std::string> other =
        MakeDevCerts(parent, {"--workers=w0", "--admins=admin"});
    ASSERT_TRUE(other.ok()) << other.status();
    certs->other_dir = *other;
    absl::StatusOr<std::string> expired =
        MakeExpiredWorkerCert(certs->dir, "w0");
    ASSERT_TRUE(expired.ok()) << expired.status();
    certs->expired = *expired;
  }

  static void TearDownTestSuite() {
    if (certs == nullptr) return;
    std::error_code ignored;
    std::filesystem::remove_all(std::filesystem::path(certs->dir).parent_path(),
                                ignored);
    delete certs;
    certs = nullptr;
  }

  void SetUp() override {
    ASSERT_NE(certs, nullptr);
    // Unix socket paths must stay short; the scratch directory may not.
    socket_dir_ = "/tmp/chorus-tls-XXXXXX";
    ASSERT_NE(mkdtemp(socket_dir_.data()), nullptr);
    std::vector<std::string> flags = {
        absl::StrCat("--tls_dir=", TlsDir("coordinator")), "--tls_refresh=1s",
        "--lease_timeout=60s"};
    for (std::string& flag : ExtraCoordinatorFlags()) flags.push_back(flag);
    absl::StatusOr<Daemon> coordinator = StartCoordinator(flags);
    ASSERT_TRUE(coordinator.ok()) << coordinator.status();
    coordinator_ = *std::move(coordinator);
    for (const std::string name : {"w0", "w1"}) {
      absl::StatusOr<Daemon> worker =
          StartWorker(coordinator_.address,
                      {absl::StrCat("--tls_dir=", TlsDir("worker-" + name)),
                       absl::StrCat("--local_socket=", Socket(name))});
      ASSERT_TRUE(worker.ok()) << worker.status();
      workers_.push_back(*std::move(worker));
    }
    registered_ = Registry();
    ASSERT_EQ(registered_.size(), 2u);
  }

  // Flags the fixture's coordinator gets besides TLS and the lease.
  virtual std::vector<std::string> ExtraCoordinatorFlags() const { return {}; }

  void TearDown() override {
    workers_.clear();
    std::error_code ignored;
    std::filesystem::remove_all(socket_dir_, ignored);
  }

  std::string Socket(const std::string& worker) const {
    return absl::StrCat(socket_dir_, "/", worker, ".sock");
  }

  std::unique_ptr<v1::Coordinator::Stub> CoordinatorAs(
      const std::optional<PemFiles>& pem) const {
    return v1::Coordinator::NewStub(ChannelAs(coordinator_.address, pem));
  }

  // The registry as the admin sees it: "id name incarnation" per worker.
  std::vector<std::string> Registry() const {
    auto stub = CoordinatorAs(ReadPemFiles(TlsDir("admin-admin")));
    v1::ListWorkersResponse response;
    auto context = Context();
    const grpc::Status status =
        stub->ListWorkers(context.get(), v1::ListWorkersRequest(), &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    std::vector<std::string> lines;
    for (const v1::WorkerInfo& w : response.workers()) {
      lines.push_back(
          absl::StrCat(w.worker_id(), " ", w.name(), " ", w.incarnation()));
    }
    return lines;
  }

  uint64_t WorkerId(const std::string& name) const {
    for (const std::string& line : registered_) {
      std::vector<std::string> parts = absl::StrSplit(line, ' ');
      if (parts[1] == name) return std::stoull(parts[0]);
    }
    ADD_FAILURE() << "no worker " << name;
    return 0;
  }

  // Joins `group` with rank r through worker w<r>'s local API on its Unix
  // socket, every rank at once; returns the epoch.
  uint64_t JoinThroughSockets(const std::string& group) {
    std::vector<uint64_t> epochs(2);
    std::vector<std::thread> ranks;
    for (int r = 0; r < 2; ++r) {
      ranks.emplace_back([&, r] {
        auto stub = v1::WorkerLocal::NewStub(
            MakeChannel(absl::StrCat("unix:", Socket(absl::StrCat("w", r))),
                        Role::kWorker));
        v1::LocalJoinRequest request;
        request.set_group(group);
        request.set_world_size(2);
        request.set_rank(r);
        v1::LocalJoinResponse response;
        auto context = Context();
        const grpc::Status status =
            stub->JoinGroup(context.get(), request, &response);
        EXPECT_TRUE(status.ok()) << status.error_message();
        epochs[r] = response.epoch();
      });
    }
    for (std::thread& t : ranks) t.join();
    EXPECT_EQ(epochs[0], epochs[1]);
    return epochs[0];
  }

  // Runs all_reduce #`sequence` (sum of i64 {r + 1}) with `algorithm` on
  // both ranks through their sockets; returns each rank's status and sum.
  std::vector<std::string> AllReduceThroughSockets(const std::string& group,
                                                   uint64_t epoch,
                                                   uint64_t sequence,
                                                   v1::Algorithm algorithm) {
    std::vector<std::string> results(2);
    std::vector<std::thread> ranks;
    for (int r = 0; r < 2; ++r) {
      ranks.emplace_back([&, r] {
        auto stub = v1::WorkerLocal::NewStub(
            MakeChannel(absl::StrCat("unix:", Socket(absl::StrCat("w", r))),
                        Role::kWorker));
        v1::LocalCollectiveRequest request =
            OneI64Sum(group, epoch, r, sequence, r + 1);
        request.set_algorithm(algorithm);
        v1::LocalCollectiveResponse response;
        auto context = Context();
        const grpc::Status status =
            stub->Collective(context.get(), request, &response);
        results[r] = SumOrError(status, response);
      });
    }
    for (std::thread& t : ranks) t.join();
    return results;
  }

  Daemon coordinator_;
  std::vector<Daemon> workers_;
  std::string socket_dir_;
  // The registry right after SetUp.
  std::vector<std::string> registered_;
};

TEST_F(TlsTest, Handshake_NoOtherCaOrExpiredCertificate_UnavailableNoChange) {
  const PemFiles admin = ReadPemFiles(TlsDir("admin-admin"));
  PemFiles no_certificate = admin;
  no_certificate.cert.clear();
  no_certificate.key.clear();
  PemFiles other_ca = ReadPemFiles(certs->other_dir + "/admin-admin");
  // Trusts our CA, so only the client side is wrong.
  other_ca.ca = admin.ca;
  PemFiles expired = ReadPemFiles(certs->expired);
  const std::vector<std::pair<std::string, std::optional<PemFiles>>> attacks = {
      {"plaintext", std::nullopt},
      {"no client certificate", no_certificate},
      {"another CA", other_ca},
      {"expired", expired}};
  for (const auto& [what, pem] : attacks) {
    SCOPED_TRACE(what);
    auto stub = CoordinatorAs(pem);
    const v1::RegisterWorkerRequest request = RegistrationAsW1();
    v1::RegisterWorkerResponse response;
    auto context = Context();
    const grpc::Status status =
        stub->RegisterWorker(context.get(), request, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE)
        << status.error_message();
  }
  EXPECT_EQ(Registry(), registered_);
}

TEST_F(TlsTest, WorkerRpcs_ForAnotherWorker_PermissionDeniedNoChange) {
  auto as_w0 = CoordinatorAs(ReadPemFiles(TlsDir("worker-w0")));
  const uint64_t w1 = WorkerId("w1");
  {
    const v1::RegisterWorkerRequest request = RegistrationAsW1();
    v1::RegisterWorkerResponse response;
    auto context = Context();
    const grpc::Status status =
        as_w0->RegisterWorker(context.get(), request, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED);
    EXPECT_THAT(status.error_message(),
                HasSubstr("worker \"w0\" may not register a worker named "
                          "\"w1\""));
  }
  {
    v1::HeartbeatRequest request;
    request.set_worker_id(w1);
    v1::HeartbeatResponse response;
    auto context = Context();
    const grpc::Status status =
        as_w0->Heartbeat(context.get(), request, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED);
    EXPECT_THAT(status.error_message(),
                HasSubstr("worker \"w0\" may not act for worker"));
  }
  {
    v1::DeregisterRequest request;
    request.set_worker_id(w1);
    v1::DeregisterResponse response;
    auto context = Context();
    const grpc::Status status =
        as_w0->Deregister(context.get(), request, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  }
  {
    v1::JoinGroupRequest request;
    request.set_group("stolen");
    request.set_world_size(1);
    request.set_worker_id(w1);
    request.mutable_device()->set_kind(v1::DEVICE_KIND_CPU);
    v1::JoinGroupResponse response;
    auto context = Context();
    const grpc::Status status =
        as_w0->JoinGroup(context.get(), request, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  }
  EXPECT_EQ(Registry(), registered_);
}

TEST_F(TlsTest, CallsForAnotherWorkersRank_PermissionDeniedGroupGoesOn) {
  const uint64_t epoch = JoinThroughSockets("g");
  auto as_w0 = CoordinatorAs(ReadPemFiles(TlsDir("worker-w0")));
  {
    v1::CollectiveRequest request;
    request.set_group("g");
    request.set_epoch(epoch);
    request.set_rank(1);  // held by w1
    request.set_sequence(1);
    *request.mutable_spec() = SpecToProto(SumOfOneI64());
    v1::CollectiveResponse response;
    auto context = Context();
    const grpc::Status status =
        as_w0->Collective(context.get(), request, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED);
    EXPECT_THAT(status.error_message(),
                HasSubstr("may not act for rank 1 of group g: worker \"w1\" "
                          "holds it"));
  }
  {
    v1::CommitRequest request;
    request.set_group("g");
    request.set_epoch(epoch);
    request.set_rank(1);
    request.set_sequence(1);
    v1::CommitResponse response;
    auto context = Context();
    EXPECT_EQ(as_w0->Commit(context.get(), request, &response).error_code(),
              grpc::StatusCode::PERMISSION_DENIED);
  }
  {
    v1::ReportFailureRequest request;
    request.set_group("g");
    request.set_epoch(epoch);
    request.set_rank(1);
    request.set_sequence(1);
    request.set_code(14);
    request.set_message("forged");
    v1::ReportFailureResponse response;
    auto context = Context();
    EXPECT_EQ(
        as_w0->ReportFailure(context.get(), request, &response).error_code(),
        grpc::StatusCode::PERMISSION_DENIED);
  }
  // Nothing was used up or aborted: #1 runs, inline and on the data plane.
  EXPECT_EQ(AllReduceThroughSockets("g", epoch, 1, v1::ALGORITHM_UNSPECIFIED),
            std::vector<std::string>({"OK 3", "OK 3"}));
  EXPECT_EQ(AllReduceThroughSockets("g", epoch, 2, v1::ALGORITHM_RING),
            std::vector<std::string>({"OK 3", "OK 3"}));
}

// The port of the TCP data plane of the worker at `address`, asked with
// worker w1's certificate.
int DataPort(const std::string& address) {
  auto peer =
      v1::Peer::NewStub(ChannelAs(address, ReadPemFiles(TlsDir("worker-w1"))));
  v1::DataPlaneInfo info;
  auto context = Context();
  EXPECT_TRUE(
      peer->DataPlane(context.get(), v1::DataPlaneRequest(), &info).ok());
  return static_cast<int>(info.tcp_port());
}

// A wire frame (wire_frame.h) of rank 1 of `group` at `epoch` to rank 0,
// after the connection's hello.
std::string HelloAndFrame(const std::string& group, uint64_t epoch) {
  MessageKey key;
  key.group = group;
  key.epoch = epoch;
  key.sequence = 99;
  key.from_rank = 1;
  key.to_rank = 0;
  key.tag = 7;
  return absl::StrCat(kWireHello, *EncodeFrameHeader(key, 6), group, "forged");
}

TEST_F(TlsTest, DataPlane_FramesFromNonMember_ClosedGroupGoesOn) {
  const uint64_t epoch = JoinThroughSockets("g");
  // w2 has a valid worker certificate but is not in the group.
  workers_.push_back(*StartWorker(
      coordinator_.address, {absl::StrCat("--tls_dir=", TlsDir("worker-w2")),
                             absl::StrCat("--local_socket=", Socket("w2"))}));
  // The TCP data plane: plaintext, and TLS from the non-member, are closed.
  const int port = DataPort(workers_[0].address);
  ASSERT_NE(port, 0);
  EXPECT_TRUE(ClosedAfterSending(port, "", HelloAndFrame("g", epoch)));
  EXPECT_TRUE(
      ClosedAfterSending(port, TlsDir("worker-w2"), HelloAndFrame("g", epoch)));
  // A connection that never starts its handshake is closed too (after the
  // listener's 5 s handshake timeout; the client waits up to 30 s).
  EXPECT_TRUE(ClosedAfterSending(port, "", ""));
  EXPECT_TRUE(WaitUntil(
      [&] {
        const std::string log = workers_[0].process->ReadLog();
        return absl::StrContains(log, "worker \"w2\" does not hold rank 1") &&
               absl::StrContains(log, "refused the connection");
      },
      absl::Seconds(30)));
  EXPECT_EQ(AllReduceThroughSockets("g", epoch, 1, v1::ALGORITHM_RING),
            std::vector<std::string>({"OK 3", "OK 3"}));
}

// The same cluster with join replies that list no members (as for a group
// above --member_list_max): each worker learns its peers from the
// coordinator when it first sends to one or a chunk arrives from one.
class TlsUnlistedMembersTest : public TlsTest {
 protected:
  std::vector<std::string> ExtraCoordinatorFlags() const override {
    return {"--member_list_max=0"};
  }
};

TEST_F(TlsUnlistedMembersTest,
       DataPlane_PeersFetchedOnDemand_MembersAdmittedNonMemberClosed) {
  const uint64_t epoch = JoinThroughSockets("g");
  EXPECT_EQ(AllReduceThroughSockets("g", epoch, 1, v1::ALGORITHM_RING),
            std::vector<std::string>({"OK 3", "OK 3"}));
  // A worker asks only as a rank it holds, and gets the members asked.
  auto as_w0 = CoordinatorAs(ReadPemFiles(TlsDir("worker-w0")));
  v1::GetGroupMembersRequest request;
  request.set_group("g");
  request.set_epoch(epoch);
  request.set_rank(1);  // held by w1
  request.add_ranks(1);
  v1::GetGroupMembersResponse response;
  {
    auto context = Context();
    const grpc::Status status =
        as_w0->GetGroupMembers(context.get(), request, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED)
        << status.error_message();
  }
  request.set_rank(0);
  {
    auto context = Context();
    ASSERT_TRUE(as_w0->GetGroupMembers(context.get(), request, &response).ok());
    ASSERT_EQ(response.members_size(), 1);
    EXPECT_EQ(response.members(0).worker_name(), "w1");
  }
  // In a new group, before any call: w2, not a member, claims rank 1 to
  // w0's data plane; w0 looks rank 1 up and closes the connection.
  const uint64_t h = JoinThroughSockets("h");
  workers_.push_back(*StartWorker(
      coordinator_.address, {absl::StrCat("--tls_dir=", TlsDir("worker-w2")),
                             absl::StrCat("--local_socket=", Socket("w2"))}));
  const int port = DataPort(workers_[0].address);
  ASSERT_NE(port, 0);
  EXPECT_TRUE(
      ClosedAfterSending(port, TlsDir("worker-w2"), HelloAndFrame("h", h)));
  EXPECT_TRUE(WaitUntil(
      [&] {
        return absl::StrContains(workers_[0].process->ReadLog(),
                                 "worker \"w2\" does not hold rank 1 of "
                                 "group h");
      },
      absl::Seconds(30)));
  EXPECT_EQ(
      AllReduceThroughSockets("h", h, 1, v1::ALGORITHM_RECURSIVE_DOUBLING),
      std::vector<std::string>({"OK 3", "OK 3"}));
}

TEST_F(TlsTest, AdminRpcs_WithWorkerOrClientIdentity_PermissionDenied) {
  for (const std::string who : {"worker-w0", "client-app"}) {
    SCOPED_TRACE(who);
    auto stub = CoordinatorAs(ReadPemFiles(TlsDir(who)));
    {
      v1::ListWorkersResponse response;
      auto context = Context();
      const grpc::Status status =
          stub->ListWorkers(context.get(), v1::ListWorkersRequest(), &response);
      EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED);
      EXPECT_THAT(status.error_message(),
                  HasSubstr("ListWorkers needs an admin certificate"));
      EXPECT_EQ(response.workers_size(), 0);
    }
    {
      v1::ListGroupsResponse response;
      auto context = Context();
      EXPECT_EQ(
          stub->ListGroups(context.get(), v1::ListGroupsRequest(), &response)
              .error_code(),
          grpc::StatusCode::PERMISSION_DENIED);
    }
    {
      v1::GetTraceRequest request;
      request.set_group("g");
      v1::GetTraceResponse response;
      auto context = Context();
      EXPECT_EQ(stub->GetTrace(context.get(), request, &response).error_code(),
                grpc::StatusCode::PERMISSION_DENIED);
    }
    {
      auto context = Context();
      std::unique_ptr<grpc::ClientReader<v1::Event>> reader =
          stub->WatchEvents(context.get(), v1::WatchEventsRequest());
      v1::Event event;
      EXPECT_FALSE(reader->Read(&event));
      const grpc::Status status = reader->Finish();
      EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED);
      EXPECT_THAT(status.error_message(),
                  HasSubstr("WatchEvents needs an admin certificate"));
    }
  }
}

TEST_F(TlsTest, PeerAndLocalApi_WrongIdentity_PermissionDenied) {
  const std::string w0 = workers_[0].address;
  // The data plane only for workers; no plaintext TCP data port is offered.
  for (const std::string who : {"client-app", "admin-admin"}) {
    auto peer = v1::Peer::NewStub(ChannelAs(w0, ReadPemFiles(TlsDir(who))));
    v1::DataPlaneInfo info;
    auto context = Context();
    const grpc::Status status =
        peer->DataPlane(context.get(), v1::DataPlaneRequest(), &info);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED) << who;
  }
  // The local API over TCP: a client certificate, not a worker's.
  v1::LocalJoinRequest join;
  join.set_group("solo");
  join.set_world_size(1);
  {
    auto local = v1::WorkerLocal::NewStub(
        ChannelAs(w0, ReadPemFiles(TlsDir("worker-w1"))));
    v1::LocalJoinResponse response;
    auto context = Context();
    const grpc::Status status =
        local->JoinGroup(context.get(), join, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED);
    EXPECT_THAT(status.error_message(),
                HasSubstr("needs a client or admin certificate"));
  }
  {
    auto local = v1::WorkerLocal::NewStub(
        ChannelAs(w0, ReadPemFiles(TlsDir("client-app"))));
    v1::LocalJoinResponse response;
    auto context = Context();
    const grpc::Status status =
        local->JoinGroup(context.get(), join, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
  }
}

// The call port the coordinator's startup line names; 0 when none.
int CallPortInLog(const std::string& log) {
  const size_t at = log.find(", call port ");
  if (at == std::string::npos) return 0;
  return std::atoi(log.c_str() + at + std::strlen(", call port "));
}

// A call-port request: all_reduce #`sequence` of `group` as `rank`.
v1::CallPortRequest CallAs(const std::string& group, uint64_t epoch, int rank,
                           uint64_t sequence) {
  v1::CallPortRequest framed;
  framed.set_call_id(7);
  framed.set_timeout_us(absl::ToInt64Microseconds(kRpcTimeout));
  v1::CollectiveRequest* call = framed.mutable_call();
  call->set_group(group);
  call->set_epoch(epoch);
  call->set_rank(rank);
  call->set_sequence(sequence);
  *call->mutable_spec() = SpecToProto(SumOfOneI64());
  const int64_t value = 100;
  call->set_has_inline_data(true);
  call->set_inline_data(
      std::string(reinterpret_cast<const char*>(&value), sizeof(value)));
  return framed;
}

TEST_F(TlsTest, CallPort_WorkersUseTls_ForgedAndPlaintextCallsRefused) {
  const uint64_t epoch = JoinThroughSockets("g");
  EXPECT_EQ(AllReduceThroughSockets("g", epoch, 1, v1::ALGORITHM_UNSPECIFIED),
            std::vector<std::string>({"OK 3", "OK 3"}));
  const int port = CallPortInLog(coordinator_.process->ReadLog());
  ASSERT_GT(port, 0) << coordinator_.process->ReadLog();
  // Both workers sent that call on the call port, over TLS.
  for (const Daemon& worker : workers_) {
    EXPECT_THAT(worker.process->ReadLog(),
                HasSubstr(absl::StrCat("connected to the coordinator's call "
                                       "port at 127.0.0.1:",
                                       port, " with mutual TLS")));
  }
  const v1::CallPortRequest forged = CallAs("g", epoch, 1, 2);
  // Plaintext, no client certificate, another CA's: closed, no reply.
  absl::StatusOr<v1::CallPortReply> reply =
      CallPortExchange(port, "", false, forged);
  EXPECT_TRUE(absl::IsUnavailable(reply.status())) << reply.status();
  EXPECT_THAT(reply.status().message(),
              ::testing::AnyOf("closed", "closed after a TLS alert"));
  reply = CallPortExchange(port, TlsDir("worker-w0"), false, forged);
  EXPECT_EQ(reply.status().message(), "closed");
  reply = CallPortExchange(port, certs->other_dir + "/worker-w0", true, forged);
  EXPECT_TRUE(absl::IsUnavailable(reply.status())) << reply.status();
  // A connection that never starts its handshake is closed after the
  // port's 5 s greeting timeout (the client waits up to 30 s).
  EXPECT_TRUE(ClosedAfterSending(port, "", ""));
  EXPECT_THAT(coordinator_.process->ReadLog(),
              HasSubstr("sent no TLS handshake within 5s"));
  // w0's certificate acting for w1's rank, and an admin's.
  reply = CallPortExchange(port, TlsDir("worker-w0"), true, forged);
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->call_id(), 7u);
  EXPECT_EQ(reply->code(),
            static_cast<int>(absl::StatusCode::kPermissionDenied));
  EXPECT_THAT(reply->message(),
              HasSubstr("may not act for rank 1 of group g: worker \"w1\" "
                        "holds it"));
  v1::CallPortRequest commit;
  commit.set_call_id(8);
  commit.mutable_commit()->set_group("g");
  commit.mutable_commit()->set_epoch(epoch);
  commit.mutable_commit()->set_rank(1);
  commit.mutable_commit()->set_sequence(2);
  reply = CallPortExchange(port, TlsDir("worker-w0"), true, commit);
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->code(),
            static_cast<int>(absl::StatusCode::kPermissionDenied));
  reply = CallPortExchange(port, TlsDir("admin-admin"), true,
                           CallAs("g", epoch, 0, 2));
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->code(),
            static_cast<int>(absl::StatusCode::kPermissionDenied));
  EXPECT_THAT(reply->message(),
              HasSubstr("Collective needs a worker certificate; the caller is "
                        "chorus://admin/admin"));
  // Nothing was used up: #2 runs inline and #3 on the data plane.
  EXPECT_EQ(AllReduceThroughSockets("g", epoch, 2, v1::ALGORITHM_UNSPECIFIED),
            std::vector<std::string>({"OK 3", "OK 3"}));
  EXPECT_EQ(AllReduceThroughSockets("g", epoch, 3, v1::ALGORITHM_RING),
            std::vector<std::string>({"OK 3", "OK 3"}));
}

TEST_F(TlsTest, CoordinatorCa_ReplacedOnDisk_NewCaAcceptedWithoutRestart) {
  // A coordinator of its own whose CA file the test rewrites.
  const std::string dir = NewScratchPath("coordinator-tls", "");
  std::filesystem::create_directories(dir);
  for (const char* file : {"ca.pem", "cert.pem", "key.pem"}) {
    std::filesystem::copy_file(TlsDir("coordinator") + "/" + file,
                               dir + "/" + file);
  }
  absl::StatusOr<Daemon> coordinator =
      StartCoordinator({absl::StrCat("--tls_dir=", dir), "--tls_refresh=1s"});
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  PemFiles other_admin = ReadPemFiles(certs->other_dir + "/admin-admin");
  other_admin.ca = ReadPemFiles(TlsDir("admin-admin")).ca;
  auto list = [&] {
    auto stub =
        v1::Coordinator::NewStub(ChannelAs(coordinator->address, other_admin));
    v1::ListWorkersResponse response;
    auto context = Context();
    return stub->ListWorkers(context.get(), v1::ListWorkersRequest(), &response)
        .error_code();
  };
  EXPECT_EQ(list(), grpc::StatusCode::UNAVAILABLE);
  {
    std::ofstream bundle(dir + "/ca.pem.new");
    bundle << ReadPemFiles(TlsDir("admin-admin")).ca
           << ReadPemFiles(certs->other_dir + "/admin-admin").ca;
  }
  std::filesystem::rename(dir + "/ca.pem.new", dir + "/ca.pem");
  EXPECT_TRUE(WaitUntil([&] { return list() == grpc::StatusCode::OK; },
                        absl::Seconds(30)));
}

TEST(TlsFlagsTest, NetworkListenWithoutTls_RefusedUnlessInsecure) {
  absl::StatusOr<CommandResult> refused = RunCommand(
      CoordinatorBinary(), {"--listen=0.0.0.0:0"}, absl::Seconds(30));
  ASSERT_TRUE(refused.ok()) << refused.status();
  EXPECT_EQ(refused->exit_code, 2);
  EXPECT_THAT(refused->err, HasSubstr("reachable from the network and TLS is "
                                      "off: give --tls_dir"));
  EXPECT_THAT(refused->err, HasSubstr("--insecure"));

  absl::StatusOr<CommandResult> worker = RunCommand(
      WorkerBinary(),
      {"--coordinator=127.0.0.1:1", "--listen=0.0.0.0:0", "--local_socket="},
      absl::Seconds(30));
  ASSERT_TRUE(worker.ok()) << worker.status();
  EXPECT_NE(worker->exit_code, 0);
  EXPECT_THAT(worker->err, HasSubstr("reachable from the network"));

  absl::StatusOr<Daemon> insecure =
      StartCoordinator({"--listen=0.0.0.0:0", "--insecure"});
  ASSERT_TRUE(insecure.ok()) << insecure.status();
  EXPECT_TRUE(WaitUntil(
      [&] {
        return absl::StrContains(insecure->process->ReadLog(),
                                 "without TLS (--insecure)");
      },
      absl::Seconds(30)));
}

TEST(TlsFlagsTest, NoListenFlagWithoutTls_WorkerOnLoopback) {
  absl::StatusOr<Daemon> coordinator = StartCoordinator();
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  const std::string port_file = NewScratchPath("worker", ".port");
  absl::StatusOr<Daemon> worker = StartDaemonCommand(
      {WorkerBinary(), absl::StrCat("--coordinator=", coordinator->address),
       "--name=plain",
       "--local_socket=", absl::StrCat("--port_file=", port_file)},
      port_file, "worker");
  ASSERT_TRUE(worker.ok()) << worker.status();
  auto stub = NewCoordinatorStub(coordinator->address);
  absl::StatusOr<std::vector<v1::WorkerInfo>> workers = ListWorkers(*stub);
  ASSERT_TRUE(workers.ok()) << workers.status();
  ASSERT_EQ(workers->size(), 1u);
  EXPECT_EQ((*workers)[0].address(), absl::StrCat("127.0.0.1:", worker->port));
}

TEST(TlsFlagsTest, WorkerNameOtherThanCertificate_Refused) {
  std::string parent = ::testing::TempDir() + "/chorus-tls-name-XXXXXX";
  ASSERT_NE(mkdtemp(parent.data()), nullptr);
  absl::StatusOr<std::string> dir = MakeDevCerts(parent, {"--workers=w0"});
  ASSERT_TRUE(dir.ok()) << dir.status();
  absl::StatusOr<CommandResult> result =
      RunCommand(WorkerBinary(),
                 {"--coordinator=127.0.0.1:1", "--listen=127.0.0.1:0",
                  "--local_socket=", "--name=w1",
                  absl::StrCat("--tls_dir=", *dir, "/worker-w0")},
                 absl::Seconds(30));
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_NE(result->exit_code, 0);
  EXPECT_THAT(result->err, HasSubstr("--name=w1 but the TLS certificate names "
                                     "chorus://worker/w0"));
  // A key that is not the certificate's.
  absl::StatusOr<CommandResult> mismatched = RunCommand(
      CoordinatorBinary(),
      {"--listen=127.0.0.1:0", absl::StrCat("--tls_ca=", *dir, "/ca.pem"),
       absl::StrCat("--tls_cert=", *dir, "/coordinator/cert.pem"),
       absl::StrCat("--tls_key=", *dir, "/worker-w0/key.pem")},
      absl::Seconds(30));
  ASSERT_TRUE(mismatched.ok()) << mismatched.status();
  EXPECT_EQ(mismatched->exit_code, 2);
  EXPECT_THAT(mismatched->err, HasSubstr("is not the key of"));
  std::error_code ignored;
  std::filesystem::remove_all(parent, ignored);
}

}  // namespace
}  // namespace chorus::test
