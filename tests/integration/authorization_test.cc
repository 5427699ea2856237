// The authorization table (common/authorization.h) tried door by door: a
// real chorus-coordinator and chorus-worker with mutual TLS, and for every
// entry of the table (each gRPC method, call-port request kind, the data
// port, each HTTP path) a caller with each role's certificate (worker,
// admin, client, coordinator). A role the entry does not list is refused
// with the table's PERMISSION_DENIED (403 over HTTP, a closed connection on
// the data port); a role it lists gets past the table (what the handler
// answers next, e.g. a worker acting for another, is not the table's
// refusal). Also: every method of the Chorus services is in the table.

#include "common/authorization.h"

#include <google/protobuf/descriptor.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/byte_buffer.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/notification.h"
#include "chorus/v1/coordinator.grpc.pb.h"
#include "chorus/v1/worker.grpc.pb.h"
#include "common/call_frame.h"
#include "common/net.h"
#include "common/tcp_socket.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "server/worker/dataplane/wire_frame.h"
#include "tests/testing/certs.h"
#include "tests/testing/daemons.h"
#include "tests/testing/etcd.h"
#include "tests/testing/http_get.h"
#include "tests/testing/raw_clients.h"

namespace chorus::test {
namespace {

constexpr absl::Duration kWait = absl::Seconds(30);
// How long a call the table lets through is given before it is counted as
// let through (a call refused by the table ends at once; one let through
// may wait for peers that never come).
constexpr absl::Duration kLetThrough = absl::Milliseconds(500);

// A certificate's holder: its role and the folder of its certificate.
struct Holder {
  Role role;
  std::string folder;
};

// What a door did with a call.
struct Outcome {
  bool refused_by_table = false;
  std::string what;  // for failure messages
};

// Calls `method` ("/chorus.v1.Service/Method") at `address` as the holder
// of `pem`, sending one empty message; ends early (cancelled) after
// kLetThrough when `expect_allowed`.
class GenericCall final
    : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  grpc::Status Run(const std::string& address, const PemFiles& pem,
                   const std::string& method, bool expect_allowed) {
    grpc::SslCredentialsOptions options;
    options.pem_root_certs = pem.ca;
    options.pem_cert_chain = pem.cert;
    options.pem_private_key = pem.key;
    auto channel = grpc::CreateChannel(address, grpc::SslCredentials(options));
    grpc::GenericStub stub(channel);
    context_.set_deadline(absl::ToChronoTime(absl::Now() + kWait));
    stub.PrepareBidiStreamingCall(&context_, method, grpc::StubOptions(), this);
    StartWrite(&empty_);
    StartWritesDone();
    StartRead(&reply_);
    StartCall();
    if (expect_allowed && !done_.WaitForNotificationWithTimeout(kLetThrough)) {
      context_.TryCancel();
    }
    done_.WaitForNotification();
    return status_;
  }

  void OnReadDone(bool ok) override {
    if (ok) StartRead(&reply_);
  }
  void OnDone(const grpc::Status& status) override {
    status_ = status;
    done_.Notify();
  }

 private:
  grpc::ClientContext context_;
  // One empty message (a ByteBuffer with no slice is not a message).
  grpc::Slice nothing_{""};
  grpc::ByteBuffer empty_{&nothing_, 1};
  grpc::ByteBuffer reply_;
  grpc::Status status_;
  absl::Notification done_;
};

class AuthorizationTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    signal(SIGPIPE, SIG_IGN);
    std::string parent = ::testing::TempDir() + "/chorus-authz-XXXXXX";
    ASSERT_NE(mkdtemp(parent.data()), nullptr);
    parent_ = new std::string(parent);
    absl::StatusOr<std::string> dir = MakeDevCerts(
        parent, {"--workers=w0,w1", "--admins=admin", "--clients=app"});
    ASSERT_TRUE(dir.ok()) << dir.status();
    dir_ = new std::string(*dir);
  }
  static void TearDownTestSuite() {
    std::error_code ignored;
    if (parent_ != nullptr) std::filesystem::remove_all(*parent_, ignored);
  }

  void SetUp() override {
    call_port_ = PickFreePort();
    metrics_port_file_ = NewScratchPath("metrics", ".port");
    absl::StatusOr<Daemon> coordinator = StartCoordinator(
        {absl::StrCat("--tls_dir=", *dir_, "/coordinator"),
         absl::StrCat("--call_port=", call_port_),
         "--metrics_listen=127.0.0.1:0",
         absl::StrCat("--metrics_port_file=", metrics_port_file_)});
    ASSERT_TRUE(coordinator.ok()) << coordinator.status();
    coordinator_ = *std::move(coordinator);
    data_port_ = PickFreePort();
    absl::StatusOr<Daemon> worker = StartWorker(
        coordinator_.address, {absl::StrCat("--tls_dir=", *dir_, "/worker-w0"),
                               absl::StrCat("--data_port=", data_port_)});
    ASSERT_TRUE(worker.ok()) << worker.status();
    worker_ = *std::move(worker);
    registry_ = RegistryAsAdmin();
    ASSERT_EQ(registry_.size(), 1u);
  }

  std::unique_ptr<v1::Coordinator::Stub> AdminStub() const {
    const PemFiles admin = ReadPemFiles(*dir_ + "/admin-admin");
    grpc::SslCredentialsOptions options;
    options.pem_root_certs = admin.ca;
    options.pem_cert_chain = admin.cert;
    options.pem_private_key = admin.key;
    return v1::Coordinator::NewStub(grpc::CreateChannel(
        coordinator_.address, grpc::SslCredentials(options)));
  }

  // "id name incarnation" of each registered worker, as the admin sees it.
  std::vector<std::string> RegistryAsAdmin() const {
    v1::ListWorkersResponse response;
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + kWait));
    const grpc::Status status =
        AdminStub()->ListWorkers(&context, v1::ListWorkersRequest(), &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    std::vector<std::string> lines;
    for (const v1::WorkerInfo& w : response.workers()) {
      lines.push_back(
          absl::StrCat(w.worker_id(), " ", w.name(), " ", w.incarnation()));
    }
    return lines;
  }

  static std::vector<Holder> Callers() {
    return {{Role::kWorker, *dir_ + "/worker-w1"},
            {Role::kAdmin, *dir_ + "/admin-admin"},
            {Role::kClient, *dir_ + "/client-app"},
            {Role::kCoordinator, *dir_ + "/coordinator"}};
  }

  Outcome TryGrpc(const DoorEntry& entry, const Holder& caller, bool allowed) {
    const std::string address =
        absl::StartsWith(entry.name, "chorus.v1.Coordinator/")
            ? coordinator_.address
            : worker_.address;
    GenericCall call;
    const grpc::Status status =
        call.Run(address, ReadPemFiles(caller.folder),
                 absl::StrCat("/", entry.name), allowed);
    return {status.error_code() == grpc::StatusCode::PERMISSION_DENIED &&
                absl::StrContains(status.error_message(),
                                  absl::StrCat(entry.name, " needs ")),
            absl::StrCat(status.error_code(), " ", status.error_message())};
  }

  Outcome TryCallPort(const DoorEntry& entry, const Holder& caller) {
    v1::CallPortRequest request;
    request.set_call_id(1);
    const absl::string_view kind = absl::StripPrefix(entry.name, "call port: ");
    if (kind == "Commit") {
      request.mutable_commit()->set_group("g");
    } else if (kind == "ReportFailure") {
      request.mutable_failure()->set_group("g");
    } else {
      request.mutable_call()->set_group("g");
    }
    std::string bytes(kCallHello);
    AppendCallFrame(request.SerializeAsString(), &bytes);
    RawClient client(call_port_, caller.folder);
    EXPECT_TRUE(client.Send(bytes));
    bool closed = false;
    CallFrameParser frames(1 << 20);
    std::string payload;
    while (!closed) {
      frames.Append(client.ReadFor(kWait, &closed));
      absl::StatusOr<bool> whole = frames.Next(&payload);
      if (whole.ok() && *whole) break;
    }
    v1::CallPortReply reply;
    reply.ParseFromString(payload);
    return {
        reply.code() == static_cast<int>(absl::StatusCode::kPermissionDenied) &&
            absl::StrContains(reply.message(),
                              absl::StrCat(entry.name, " needs ")),
        absl::StrCat(reply.code(), " ", reply.message())};
  }

  Outcome TryDataPort(const Holder& caller, bool allowed) {
    RawClient client(data_port_, caller.folder);
    client.Send(kWireHello);
    bool closed = false;
    client.ReadFor(allowed ? kLetThrough : kWait, &closed);
    return {closed, closed ? "closed" : "kept open"};
  }

  Outcome TryHttp(const DoorEntry& entry, const Holder& caller) {
    httplib::SSLClient client("127.0.0.1", ReadPort(metrics_port_file_),
                              caller.folder + "/cert.pem",
                              caller.folder + "/key.pem");
    client.set_ca_cert_path((caller.folder + "/ca.pem").c_str());
    client.enable_server_certificate_verification(true);
    client.set_connection_timeout(10);
    client.set_read_timeout(10);
    httplib::Result result =
        client.Get(std::string(absl::StripPrefix(entry.name, "GET ")));
    if (!result) return {false, httplib::to_string(result.error())};
    return {result->status == 403 &&
                absl::StrContains(result->body,
                                  absl::StrCat(entry.name, " needs ")),
            absl::StrCat(result->status, " ", result->body)};
  }

  Outcome Try(const DoorEntry& entry, const Holder& caller, bool allowed) {
    if (absl::StartsWith(entry.name, "chorus.v1.")) {
      return TryGrpc(entry, caller, allowed);
    }
    if (absl::StartsWith(entry.name, "call port: ")) {
      return TryCallPort(entry, caller);
    }
    if (entry.name == "data port: frames") return TryDataPort(caller, allowed);
    return TryHttp(entry, caller);
  }

  static std::string* parent_;
  static std::string* dir_;
  Daemon coordinator_;
  Daemon worker_;
  int call_port_ = 0;
  int data_port_ = 0;
  std::string metrics_port_file_;
  // The registry right after SetUp.
  std::vector<std::string> registry_;
};

std::string* AuthorizationTest::parent_ = nullptr;
std::string* AuthorizationTest::dir_ = nullptr;

TEST_F(AuthorizationTest, EveryEntry_EveryRole_RefusedUnlessTheTableAllows) {
  int tried = 0;
  for (const DoorEntry& entry : AuthorizationTable()) {
    for (const Holder& caller : Callers()) {
      const bool allowed = (entry.roles & RoleBit(caller.role)) != 0;
      SCOPED_TRACE(absl::StrCat(entry.name, " as ", RoleName(caller.role)));
      const Outcome outcome = Try(entry, caller, allowed);
      EXPECT_EQ(outcome.refused_by_table, !allowed) << outcome.what;
      ++tried;
    }
  }
  EXPECT_EQ(tried, static_cast<int>(AuthorizationTable().size() * 4));
  // Nothing changed: w0 is still the one worker, registered as before, and
  // no group formed or is forming.
  EXPECT_EQ(RegistryAsAdmin(), registry_);
  v1::ListGroupsResponse groups;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + kWait));
  ASSERT_TRUE(
      AdminStub()->ListGroups(&context, v1::ListGroupsRequest(), &groups).ok());
  EXPECT_EQ(groups.groups_size(), 0);
  EXPECT_EQ(groups.forming_size(), 0);
}

// The policy itself, written out once more: a change to the table must
// change this too, on purpose.
TEST(AuthorizationTableTest, Table_IsThePolicy) {
  const std::map<std::string, std::string> expected = {
      {"chorus.v1.Coordinator/RegisterWorker", "worker"},
      {"chorus.v1.Coordinator/Heartbeat", "worker"},
      {"chorus.v1.Coordinator/Deregister", "worker"},
      {"chorus.v1.Coordinator/JoinGroup", "worker"},
      {"chorus.v1.Coordinator/GetGroupMembers", "worker"},
      {"chorus.v1.Coordinator/Collective", "worker"},
      {"chorus.v1.Coordinator/Commit", "worker"},
      {"chorus.v1.Coordinator/ReportFailure", "worker"},
      {"chorus.v1.Coordinator/ListWorkers", "admin"},
      {"chorus.v1.Coordinator/ListGroups", "admin"},
      {"chorus.v1.Coordinator/GetTrace", "admin"},
      {"chorus.v1.Coordinator/WatchEvents", "admin"},
      {"chorus.v1.Coordinator/Store", "client worker"},
      {"call port: Collective", "worker"},
      {"call port: Commit", "worker"},
      {"call port: ReportFailure", "worker"},
      {"chorus.v1.WorkerLocal/JoinGroup", "admin client"},
      {"chorus.v1.WorkerLocal/Collective", "admin client"},
      {"chorus.v1.WorkerLocal/CollectiveChunked", "admin client"},
      {"chorus.v1.WorkerLocal/HoldMembership", "admin client"},
      {"chorus.v1.WorkerLocal/OpenSharedRegion", "admin client"},
      {"chorus.v1.WorkerLocal/ReleaseSharedRegion", "admin client"},
      {"chorus.v1.Peer/DataPlane", "worker"},
      {"data port: frames", "worker"},
      {"GET /metrics", "admin client"},
      {"GET /", "admin"},
  };
  std::map<std::string, std::string> table;
  for (const DoorEntry& entry : AuthorizationTable()) {
    std::vector<std::string> roles;
    for (Role role :
         {Role::kAdmin, Role::kClient, Role::kCoordinator, Role::kWorker}) {
      if ((entry.roles & RoleBit(role)) != 0) {
        roles.push_back(std::string(RoleName(role)));
      }
    }
    table[std::string(entry.name)] = absl::StrJoin(roles, " ");
  }
  EXPECT_EQ(table, expected);
}

TEST(AuthorizationTableTest, EveryServiceMethod_InTheTable) {
  // Asking for a message of each file links it in and loads it.
  const google::protobuf::DescriptorPool* pool =
      v1::LocalJoinRequest::descriptor()->file()->pool();
  ASSERT_NE(v1::RegisterWorkerRequest::descriptor(), nullptr);
  for (const char* name :
       {"chorus.v1.Coordinator", "chorus.v1.WorkerLocal", "chorus.v1.Peer"}) {
    const google::protobuf::ServiceDescriptor* service =
        pool->FindServiceByName(name);
    ASSERT_NE(service, nullptr) << name;
    for (int i = 0; i < service->method_count(); ++i) {
      const std::string method =
          absl::StrCat(name, "/", service->method(i)->name());
      const Identity nobody{Role::kCoordinator, ""};
      EXPECT_NE(Authorize(method, nobody).code(), absl::StatusCode::kInternal)
          << method << " is not in the authorization table";
    }
  }
}

}  // namespace
}  // namespace chorus::test
