// The attack table: a real chorus-coordinator and two chorus-workers with
// mutual TLS, a revocation list and a formed group "g", tried as an
// attacker would, one row per attack: other CAs, no certificate, expired
// and revoked certificates, plaintext, every role acting beyond its own
// (a worker for another, another job's worker and client, admins and
// clients on workers' doors), malformed and oversized requests, silent
// connections. Each row asserts the answer (a status code, "closed", or an
// HTTP status) and that the cluster is unchanged afterwards: the same
// workers and the same group, still at its epoch with one collective done.
// The rows are printed as a table.

#include <grpcpp/create_channel.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/byte_buffer.h>
#include <signal.h>

#include <filesystem>
#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/notification.h"
#include "chorus/v1/coordinator.grpc.pb.h"
#include "chorus/v1/worker.grpc.pb.h"
#include "common/call_frame.h"
#include "common/net.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "server/worker/dataplane/wire_frame.h"
#include "tests/testing/certs.h"
#include "tests/testing/daemons.h"
#include "tests/testing/etcd.h"
#include "tests/testing/http_get.h"
#include "tests/testing/local_calls.h"
#include "tests/testing/raw_clients.h"

namespace chorus::test {
namespace {

// Who calls: a folder of certificates, or one of these.
constexpr char kPlaintext[] = "plaintext";
constexpr char kNoCertificate[] = "no certificate";

struct Attack {
  std::string what;
  // "PERMISSION_DENIED" (a status code), "closed", or "403".
  std::string want;
  std::function<std::string()> run;
};

std::string CodeName(int code) {
  return absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
}

class AttackTableTest : public ::testing::Test {
 protected:
  void SetUp() override {
    signal(SIGPIPE, SIG_IGN);
    parent_ = ::testing::TempDir() + "/chorus-attacks-XXXXXX";
    ASSERT_NE(mkdtemp(parent_.data()), nullptr);
    absl::StatusOr<std::string> dir = MakeDevCerts(
        parent_,
        {"--workers=w0,w1,w2", "--admins=admin,ex", "--clients=app,gone"});
    ASSERT_TRUE(dir.ok()) << dir.status();
    dir_ = *dir;
    ASSERT_TRUE(
        AddDevCerts(dir_, {"--job=blue", "--workers=w0", "--clients=app"})
            .ok());
    for (const char* who : {"admin-ex", "client-gone", "worker-w2"}) {
      ASSERT_TRUE(AddDevCerts(dir_, {absl::StrCat("--revoke=", dir_, "/", who,
                                                  "/cert.pem")})
                      .ok());
    }
    absl::StatusOr<std::string> other =
        MakeDevCerts(parent_, {"--workers=w0", "--admins=admin"});
    ASSERT_TRUE(other.ok()) << other.status();
    other_ = *other;
    absl::StatusOr<std::string> expired = MakeExpiredWorkerCert(dir_, "w0");
    ASSERT_TRUE(expired.ok()) << expired.status();
    expired_ = *expired;
    StartCluster();
  }

  void TearDown() override {
    workers_.clear();
    std::error_code ignored;
    std::filesystem::remove_all(parent_, ignored);
    std::filesystem::remove_all(socket_dir_, ignored);
  }

  void StartCluster() {
    socket_dir_ = "/tmp/chorus-attacks-XXXXXX";
    ASSERT_NE(mkdtemp(socket_dir_.data()), nullptr);
    call_port_ = PickFreePort();
    const std::string crl = absl::StrCat("--tls_crl=", dir_, "/crl.pem");
    const std::string coordinator_metrics = NewScratchPath("metrics", ".port");
    absl::StatusOr<Daemon> coordinator = StartCoordinator(
        {Tls("coordinator"), crl, absl::StrCat("--call_port=", call_port_),
         "--metrics_listen=127.0.0.1:0",
         absl::StrCat("--metrics_port_file=", coordinator_metrics),
         "--lease_timeout=60s"});
    ASSERT_TRUE(coordinator.ok()) << coordinator.status();
    coordinator_ = *std::move(coordinator);
    coordinator_metrics_ = ReadPort(coordinator_metrics);
    const std::string worker_metrics = NewScratchPath("metrics", ".port");
    for (int w = 0; w < 2; ++w) {
      std::vector<std::string> flags = {
          Tls(absl::StrCat("worker-w", w)), crl,
          absl::StrCat("--local_socket=", socket_dir_, "/w", w, ".sock")};
      if (w == 0) {
        flags.push_back("--metrics_listen=127.0.0.1:0");
        flags.push_back(absl::StrCat("--metrics_port_file=", worker_metrics));
      }
      absl::StatusOr<Daemon> worker = StartWorker(coordinator_.address, flags);
      ASSERT_TRUE(worker.ok()) << worker.status();
      workers_.push_back(*std::move(worker));
    }
    worker_metrics_ = ReadPort(worker_metrics);
    FormGroup();
    v1::DataPlaneInfo info;
    auto context = Context();
    ASSERT_TRUE(v1::Peer::NewStub(Channel(workers_[0].address, "worker-w1"))
                    ->DataPlane(context.get(), v1::DataPlaneRequest(), &info)
                    .ok());
    data_port_ = static_cast<int>(info.tcp_port());
    for (const std::string& line : Workers()) ids_.push_back(line);
  }

  // Forms "g" with w0 and w1 through their sockets and runs one all_reduce.
  void FormGroup() {
    std::vector<std::thread> ranks;
    std::vector<std::string> sums(2);
    std::vector<uint64_t> epochs(2);
    for (int r = 0; r < 2; ++r) {
      ranks.emplace_back([&, r] {
        auto local = v1::WorkerLocal::NewStub(
            MakeChannel(absl::StrCat("unix:", socket_dir_, "/w", r, ".sock"),
                        Role::kWorker));
        v1::LocalJoinRequest join;
        join.set_group("g");
        join.set_world_size(2);
        join.set_rank(r);
        v1::LocalJoinResponse joined;
        grpc::Status status = local->JoinGroup(Context().get(), join, &joined);
        if (!status.ok()) {
          sums[r] = status.error_message();
          return;
        }
        epochs[r] = joined.epoch();
        v1::LocalCollectiveResponse response;
        status = local->Collective(Context().get(),
                                   OneI64Sum("g", joined.epoch(), r, 1, r + 1),
                                   &response);
        sums[r] = SumOrError(status, response);
      });
    }
    for (std::thread& rank : ranks) rank.join();
    ASSERT_EQ(sums, std::vector<std::string>({"OK 3", "OK 3"}));
    ASSERT_EQ(epochs[0], epochs[1]);
    epoch_ = epochs[0];
  }

  std::string Tls(const std::string& who) const {
    return absl::StrCat("--tls_dir=", dir_, "/", who);
  }
  std::string Folder(const std::string& who) const {
    if (absl::StartsWith(who, "other:")) {
      return absl::StrCat(other_, "/", who.substr(6));
    }
    if (who == "expired") return expired_;
    return absl::StrCat(dir_, "/", who);
  }

  static std::unique_ptr<grpc::ClientContext> Context() {
    auto context = std::make_unique<grpc::ClientContext>();
    context->set_deadline(DeadlineAfter(kRpcTimeout));
    return context;
  }

  std::shared_ptr<grpc::Channel> Channel(const std::string& address,
                                         const std::string& who) const {
    if (who == kPlaintext) {
      return grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
    }
    const PemFiles pem =
        ReadPemFiles(Folder(who == kNoCertificate ? "admin-admin" : who));
    grpc::SslCredentialsOptions options;
    options.pem_root_certs = pem.ca;
    if (who != kNoCertificate) {
      options.pem_cert_chain = pem.cert;
      options.pem_private_key = pem.key;
    }
    return grpc::CreateChannel(address, grpc::SslCredentials(options));
  }

  // Calls `method` ("chorus.v1.Coordinator/Heartbeat") at `address` as
  // `who` with `request`; returns the status code's name.
  std::string Rpc(const std::string& address, const std::string& who,
                  const std::string& method,
                  const google::protobuf::Message& request) const {
    grpc::GenericStub stub(Channel(address, who));
    grpc::Slice slice(request.SerializeAsString());
    grpc::ByteBuffer sent(&slice, 1);
    grpc::ByteBuffer received;
    auto context = Context();
    absl::Notification done;
    grpc::Status status;
    stub.UnaryCall(context.get(), absl::StrCat("/", method),
                   grpc::StubOptions(), &sent, &received, [&](grpc::Status s) {
                     status = std::move(s);
                     done.Notify();
                   });
    done.WaitForNotification();
    return CodeName(status.error_code());
  }

  // Sends the call port's hello (unless not `hello`) then `frames` as `who`
  // (a folder, or kPlaintext); returns the code of the first reply,
  // "closed", or "open" when nothing came for 30 s.
  std::string CallPort(const std::string& who, const std::string& frames,
                       bool hello = true) const {
    RawClient client(call_port_, who == kPlaintext ? "" : Folder(who));
    const std::string bytes = absl::StrCat(hello ? kCallHello : "", frames);
    if (!bytes.empty() && !client.Send(bytes)) return "closed";
    CallFrameParser parser(1 << 20);
    bool closed = false;
    while (!closed) {
      const std::string some = client.ReadFor(absl::Seconds(30), &closed);
      if (some.empty() && !closed) return "open";
      parser.Append(some);
      std::string payload;
      absl::StatusOr<bool> whole = parser.Next(&payload);
      v1::CallPortReply reply;
      if (whole.ok() && *whole && reply.ParseFromString(payload)) {
        return CodeName(reply.code());
      }
    }
    return "closed";
  }

  // One call-port frame carrying `request`.
  static std::string Frame(const v1::CallPortRequest& request) {
    std::string bytes;
    AppendCallFrame(request.SerializeAsString(), &bytes);
    return bytes;
  }

  // Returns the HTTP status of GET `path` at `port` as `who`, or "closed".
  std::string Https(int port, const std::string& who,
                    const std::string& path) const {
    if (who == kPlaintext) {
      return ClosedAfterSending(port, "", "GET /metrics HTTP/1.1\r\n\r\n")
                 ? "closed"
                 : "open";
    }
    httplib::SSLClient client("127.0.0.1", port, Folder(who) + "/cert.pem",
                              Folder(who) + "/key.pem");
    client.set_ca_cert_path((Folder(who) + "/ca.pem").c_str());
    client.enable_server_certificate_verification(true);
    client.set_connection_timeout(10);
    client.set_read_timeout(10);
    httplib::Result result = client.Get(path);
    return result ? absl::StrCat(result->status) : "closed";
  }

  // What the admin sees: every worker, and every group with its epoch,
  // members and progress.
  std::vector<std::string> Workers() const {
    v1::ListWorkersResponse response;
    EXPECT_TRUE(
        v1::Coordinator::NewStub(Channel(coordinator_.address, "admin-admin"))
            ->ListWorkers(Context().get(), v1::ListWorkersRequest(), &response)
            .ok());
    std::vector<std::string> lines;
    for (const v1::WorkerInfo& w : response.workers()) {
      lines.push_back(absl::StrCat(w.job(), "/", w.name(), " ", w.worker_id(),
                                   " ", w.incarnation()));
    }
    return lines;
  }
  std::vector<std::string> Cluster() const {
    std::vector<std::string> lines = Workers();
    v1::ListGroupsResponse response;
    EXPECT_TRUE(
        v1::Coordinator::NewStub(Channel(coordinator_.address, "admin-admin"))
            ->ListGroups(Context().get(), v1::ListGroupsRequest(), &response)
            .ok());
    for (const v1::GroupInfo& g : response.groups()) {
      lines.push_back(absl::StrCat(
          "group ", g.job(), "/", g.name(), " epoch ", g.epoch(), " done ",
          g.completed(), " pending ", g.pending_sequence(), " members ",
          g.members_size(), " aborted ", g.aborted().code()));
    }
    for (const v1::GroupInfo& g : response.forming()) {
      lines.push_back(absl::StrCat("forming ", g.name()));
    }
    return lines;
  }

  uint64_t WorkerId(int w) const {
    return std::stoull(ids_[w].substr(ids_[w].find(' ') + 1));
  }

  std::vector<Attack> CoordinatorRows() const;
  std::vector<Attack> CallPortRows() const;
  std::vector<Attack> WorkerRows() const;

  std::string parent_, dir_, other_, expired_, socket_dir_;
  Daemon coordinator_;
  std::vector<Daemon> workers_;
  int call_port_ = 0, data_port_ = 0;
  int coordinator_metrics_ = 0, worker_metrics_ = 0;
  uint64_t epoch_ = 0;
  std::vector<std::string> ids_;
};

// Rank `rank`'s all_reduce (sum) of one f32 as call #2 of "g" at `epoch`,
// its data inline.
v1::CollectiveRequest SumCall(uint64_t epoch, int rank) {
  v1::CollectiveRequest call;
  call.set_group("g");
  call.set_epoch(epoch);
  call.set_rank(rank);
  call.set_sequence(2);
  call.mutable_spec()->set_kind(v1::COLLECTIVE_KIND_ALL_REDUCE);
  call.mutable_spec()->set_dtype(v1::DTYPE_F32);
  call.mutable_spec()->set_count(1);
  call.mutable_spec()->set_op(v1::REDUCE_OP_SUM);
  call.set_has_inline_data(true);
  call.set_inline_data(std::string(4, '\0'));
  return call;
}

v1::JoinGroupRequest JoinAs(uint64_t worker_id, int world_size) {
  v1::JoinGroupRequest join;
  join.set_group("h");
  join.set_world_size(world_size);
  join.set_rank(0);
  join.set_worker_id(worker_id);
  join.mutable_device()->set_kind(v1::DEVICE_KIND_CPU);
  return join;
}

v1::RegisterWorkerRequest RegistrationOf(const std::string& name) {
  v1::RegisterWorkerRequest request;
  request.set_name(name);
  request.set_address("127.0.0.1:1");
  request.set_incarnation(99);
  request.add_devices()->set_kind(v1::DEVICE_KIND_CPU);
  return request;
}

std::vector<Attack> AttackTableTest::CoordinatorRows() const {
  const std::string c = coordinator_.address;
  const uint64_t w0 = WorkerId(0);
  const uint64_t e = epoch_;
  v1::HeartbeatRequest beat;
  beat.set_worker_id(w0);
  beat.set_incarnation(1);
  v1::DeregisterRequest leave;
  leave.set_worker_id(w0);
  v1::CommitRequest commit;
  commit.set_group("g");
  commit.set_epoch(e);
  commit.set_sequence(1);
  v1::ReportFailureRequest failure;
  failure.set_group("g");
  failure.set_epoch(e);
  failure.set_sequence(1);
  failure.set_code(14);
  v1::GetTraceRequest trace;
  trace.set_group("g");
  v1::CollectiveRequest bad_dtype = SumCall(e, 0);
  bad_dtype.mutable_spec()->set_dtype(static_cast<v1::DType>(99));
  v1::CollectiveRequest huge_count = SumCall(e, 0);
  huge_count.mutable_spec()->set_count(int64_t{1} << 62);
  v1::CollectiveRequest short_data = SumCall(e, 0);
  short_data.set_inline_data("abc");
  v1::CollectiveRequest bad_op = SumCall(e, 0);
  bad_op.mutable_spec()->set_op(static_cast<v1::ReduceOp>(42));
  v1::JoinGroupRequest odd_device = JoinAs(w0, 2);
  odd_device.mutable_device()->set_kind(static_cast<v1::DeviceKind>(77));
  v1::JoinGroupRequest vulkan = JoinAs(w0, 2);
  vulkan.mutable_device()->set_kind(v1::DEVICE_KIND_VULKAN);
  v1::CollectiveRequest oversized = SumCall(e, 0);
  oversized.set_inline_data(std::string((64 << 20) + 1, 'x'));
  const std::string co = "chorus.v1.Coordinator/";
  std::vector<Attack> rows;
  auto add = [&](std::string what, std::string want, std::string who,
                 std::string method,
                 std::shared_ptr<google::protobuf::Message> request) {
    rows.push_back({std::move(what), std::move(want),
                    [this, c, who, method = co + method, request] {
                      return Rpc(c, who, method, *request);
                    }});
  };
  auto copy = [](const google::protobuf::Message& m) {
    std::shared_ptr<google::protobuf::Message> out(m.New());
    out->CopyFrom(m);
    return out;
  };
  const auto list = copy(v1::ListWorkersRequest());
  add("coordinator: plaintext", "UNAVAILABLE", kPlaintext, "ListWorkers", list);
  add("coordinator: TLS without a client certificate", "UNAVAILABLE",
      kNoCertificate, "ListWorkers", list);
  add("coordinator: another CA's admin", "UNAVAILABLE", "other:admin-admin",
      "ListWorkers", list);
  add("coordinator: another CA's worker w0 heartbeats", "UNAVAILABLE",
      "other:worker-w0", "Heartbeat", copy(beat));
  add("coordinator: expired certificate of w0 heartbeats", "UNAVAILABLE",
      "expired", "Heartbeat", copy(beat));
  add("coordinator: revoked admin lists workers", "UNAUTHENTICATED", "admin-ex",
      "ListWorkers", list);
  add("coordinator: revoked worker w2 registers", "UNAUTHENTICATED",
      "worker-w2", "RegisterWorker", copy(RegistrationOf("w2")));
  add("worker w1 registers as w0", "PERMISSION_DENIED", "worker-w1",
      "RegisterWorker", copy(RegistrationOf("w0")));
  add("worker w1 heartbeats for w0", "PERMISSION_DENIED", "worker-w1",
      "Heartbeat", copy(beat));
  add("worker w1 deregisters w0", "PERMISSION_DENIED", "worker-w1",
      "Deregister", copy(leave));
  add("worker w1 joins with w0's worker id", "PERMISSION_DENIED", "worker-w1",
      "JoinGroup", copy(JoinAs(w0, 2)));
  add("worker w1 calls as rank 0 of g", "PERMISSION_DENIED", "worker-w1",
      "Collective", copy(SumCall(e, 0)));
  add("worker w1 commits for rank 0 of g", "PERMISSION_DENIED", "worker-w1",
      "Commit", copy(commit));
  add("worker w1 reports a failure of rank 0 of g", "PERMISSION_DENIED",
      "worker-w1", "ReportFailure", copy(failure));
  add("worker lists workers", "PERMISSION_DENIED", "worker-w0", "ListWorkers",
      list);
  add("worker lists groups", "PERMISSION_DENIED", "worker-w0", "ListGroups",
      copy(v1::ListGroupsRequest()));
  add("worker reads g's trace", "PERMISSION_DENIED", "worker-w0", "GetTrace",
      copy(trace));
  add("worker watches events", "PERMISSION_DENIED", "worker-w0", "WatchEvents",
      copy(v1::WatchEventsRequest()));
  add("client lists workers", "PERMISSION_DENIED", "client-app", "ListWorkers",
      list);
  add("client registers a worker", "PERMISSION_DENIED", "client-app",
      "RegisterWorker", copy(RegistrationOf("app")));
  add("admin registers a worker", "PERMISSION_DENIED", "admin-admin",
      "RegisterWorker", copy(RegistrationOf("admin")));
  add("admin calls as rank 0 of g", "PERMISSION_DENIED", "admin-admin",
      "Collective", copy(SumCall(e, 0)));
  add("the coordinator's certificate registers a worker", "PERMISSION_DENIED",
      "coordinator", "RegisterWorker", copy(RegistrationOf("w0")));
  add("job blue's w0 heartbeats for the default job's w0", "PERMISSION_DENIED",
      "job-blue/worker-w0", "Heartbeat", copy(beat));
  add("job blue's w0 calls as rank 0 of g (another job's group)", "NOT_FOUND",
      "job-blue/worker-w0", "Collective", copy(SumCall(e, 0)));
  add("w0 calls with an unknown dtype", "INVALID_ARGUMENT", "worker-w0",
      "Collective", copy(bad_dtype));
  add("w0 calls with an unknown reduce op", "INVALID_ARGUMENT", "worker-w0",
      "Collective", copy(bad_op));
  add("w0 calls with a count of 2^62", "INVALID_ARGUMENT", "worker-w0",
      "Collective", copy(huge_count));
  add("w0 calls with 3 bytes for one f32", "INVALID_ARGUMENT", "worker-w0",
      "Collective", copy(short_data));
  add("w0 calls at a stale epoch", "FAILED_PRECONDITION", "worker-w0",
      "Collective", copy(SumCall(e - 1, 0)));
  add("w0 calls on a group that does not exist", "NOT_FOUND", "worker-w0",
      "Collective", copy([&] {
        v1::CollectiveRequest none = SumCall(e, 0);
        none.set_group("nope");
        return none;
      }()));
  add("w0 joins with a world size of 1,000,000", "INVALID_ARGUMENT",
      "worker-w0", "JoinGroup", copy(JoinAs(w0, 1000000)));
  add("w0 joins with an unknown device kind", "INVALID_ARGUMENT", "worker-w0",
      "JoinGroup", copy(odd_device));
  add("w0 joins with a Vulkan device", "UNIMPLEMENTED", "worker-w0",
      "JoinGroup", copy(vulkan));
  add("w0 sends a 64 MiB + 1 message", "RESOURCE_EXHAUSTED", "worker-w0",
      "Collective", copy(oversized));
  return rows;
}

std::vector<Attack> AttackTableTest::CallPortRows() const {
  v1::CallPortRequest call;
  call.set_call_id(7);
  call.set_timeout_us(absl::ToInt64Microseconds(kRpcTimeout));
  *call.mutable_call() = SumCall(epoch_, 0);
  v1::CallPortRequest commit;
  commit.set_call_id(8);
  commit.mutable_commit()->set_group("g");
  commit.mutable_commit()->set_epoch(epoch_);
  commit.mutable_commit()->set_sequence(1);
  v1::CallPortRequest empty;
  empty.set_call_id(9);
  const std::string call_frame = Frame(call);
  std::vector<Attack> rows;
  auto add = [&](std::string what, std::string want, std::string who,
                 std::string frames, bool hello = true) {
    rows.push_back(
        {absl::StrCat("call port: ", what), std::move(want),
         [this, who, frames, hello] { return CallPort(who, frames, hello); }});
  };
  add("plaintext", "closed", kPlaintext, call_frame);
  add("TLS with another CA's worker w0", "closed", "other:worker-w0",
      call_frame);
  add("expired certificate of w0", "closed", "expired", call_frame);
  add("revoked worker w2", "UNAUTHENTICATED", "worker-w2", call_frame);
  add("worker w1 calls as rank 0", "PERMISSION_DENIED", "worker-w1",
      call_frame);
  add("worker w1 commits for rank 0", "PERMISSION_DENIED", "worker-w1",
      Frame(commit));
  add("admin calls as rank 0", "PERMISSION_DENIED", "admin-admin", call_frame);
  add("client calls as rank 0", "PERMISSION_DENIED", "client-app", call_frame);
  add("job blue's w0 calls on g", "NOT_FOUND", "job-blue/worker-w0",
      call_frame);
  add("a request carrying nothing", "INVALID_ARGUMENT", "worker-w0",
      Frame(empty));
  add("a frame that is no request", "INVALID_ARGUMENT", "worker-w0", [] {
    std::string bytes;
    AppendCallFrame("\xff\xff\xff not a protobuf", &bytes);
    return bytes;
  }());
  add("a frame announcing 2 GiB", "RESOURCE_EXHAUSTED", "worker-w0",
      std::string("\xff\xff\xff\x7f", 4));
  add("a TLS connection that sends no hello (5 s)", "closed", "worker-w0", "",
      /*hello=*/false);
  return rows;
}

std::vector<Attack> AttackTableTest::WorkerRows() const {
  const std::string w0 = workers_[0].address;
  v1::LocalJoinRequest solo;
  solo.set_group("solo");
  solo.set_world_size(1);
  v1::LocalJoinRequest empty_world;
  empty_world.set_group("none");
  v1::LocalCollectiveRequest odd_size = OneI64Sum("g", epoch_, 0, 2, 1);
  odd_size.set_data("abc");
  std::vector<Attack> rows;
  auto rpc = [&](std::string what, std::string want, std::string who,
                 std::string method, const google::protobuf::Message& request) {
    std::shared_ptr<google::protobuf::Message> copy(request.New());
    copy->CopyFrom(request);
    rows.push_back(
        {std::move(what), std::move(want), [this, w0, who, method, copy] {
           return Rpc(w0, who, method, *copy);
         }});
  };
  const std::string local = "chorus.v1.WorkerLocal/JoinGroup";
  rpc("worker local API: plaintext over TCP", "UNAVAILABLE", kPlaintext, local,
      solo);
  rpc("worker local API: a worker's certificate", "PERMISSION_DENIED",
      "worker-w1", local, solo);
  rpc("worker local API: revoked client", "UNAUTHENTICATED", "client-gone",
      local, solo);
  rpc("worker local API: job blue's client", "PERMISSION_DENIED",
      "job-blue/client-app", local, solo);
  rpc("worker local API: a join with world size 0", "INVALID_ARGUMENT",
      "client-app", local, empty_world);
  rpc("worker local API: 3 bytes for one i64", "INVALID_ARGUMENT", "client-app",
      "chorus.v1.WorkerLocal/Collective", odd_size);
  const std::string peer = "chorus.v1.Peer/DataPlane";
  rpc("worker Peer service: client", "PERMISSION_DENIED", "client-app", peer,
      v1::DataPlaneRequest());
  rpc("worker Peer service: admin", "PERMISSION_DENIED", "admin-admin", peer,
      v1::DataPlaneRequest());
  rpc("worker Peer service: job blue's w0", "PERMISSION_DENIED",
      "job-blue/worker-w0", peer, v1::DataPlaneRequest());
  rpc("worker Peer service: revoked worker w2", "UNAUTHENTICATED", "worker-w2",
      peer, v1::DataPlaneRequest());
  auto data = [&](std::string what, std::string who) {
    rows.push_back({absl::StrCat("data port: ", what), "closed", [this, who] {
                      return ClosedAfterSending(
                                 data_port_,
                                 who == kPlaintext ? "" : Folder(who),
                                 std::string(kWireHello))
                                 ? "closed"
                                 : "open";
                    }});
  };
  data("plaintext", kPlaintext);
  data("client's certificate", "client-app");
  data("admin's certificate", "admin-admin");
  data("job blue's w0", "job-blue/worker-w0");
  data("revoked worker w2", "worker-w2");
  data("another CA's worker w0", "other:worker-w0");
  auto http = [&](std::string what, std::string want, int port, std::string who,
                  std::string path) {
    rows.push_back({what, std::move(want), [this, port, who, path] {
                      return Https(port, who, path);
                    }});
  };
  http("coordinator status page: client", "403", coordinator_metrics_,
       "client-app", "/");
  http("coordinator status page: worker", "403", coordinator_metrics_,
       "worker-w0", "/");
  http("coordinator metrics: job blue's client", "403", coordinator_metrics_,
       "job-blue/client-app", "/metrics");
  http("coordinator metrics: revoked client", "403", coordinator_metrics_,
       "client-gone", "/metrics");
  http("coordinator metrics: plaintext", "closed", coordinator_metrics_,
       kPlaintext, "/metrics");
  http("worker metrics: job blue's client", "403", worker_metrics_,
       "job-blue/client-app", "/metrics");
  http("worker metrics: another CA's admin", "closed", worker_metrics_,
       "other:admin-admin", "/metrics");
  return rows;
}

TEST_F(AttackTableTest, EveryAttack_RefusedWithItsCodeNothingChanged) {
  const std::vector<std::string> before = Cluster();
  ASSERT_EQ(before.size(), 3u);  // two workers and g
  std::vector<Attack> rows = CoordinatorRows();
  for (std::vector<Attack> more : {CallPortRows(), WorkerRows()}) {
    rows.insert(rows.end(), more.begin(), more.end());
  }
  EXPECT_GE(rows.size(), 50u);
  int refused = 0;
  std::string table =
      absl::StrFormat("%-64s %-20s %s\n", "attack", "want", "got");
  for (const Attack& row : rows) {
    const std::string got = row.run();
    absl::StrAppendFormat(&table, "%-64s %-20s %s\n", row.what, row.want, got);
    EXPECT_EQ(got, row.want) << row.what;
    EXPECT_EQ(Cluster(), before) << "after: " << row.what;
    refused += got == row.want;
  }
  std::cout << table << refused << " of " << rows.size()
            << " attacks refused as the table says\n";
}

}  // namespace
}  // namespace chorus::test
