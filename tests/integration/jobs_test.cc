// Groups belong to a job: a real chorus-coordinator and four chorus-workers
// with mutual TLS, two of job "blue" and two of job "red", each job with
// workers named w0 and w1 (scripts/dev_certs.sh --job). Each job has groups
// of its own: both form a group "train" and get their own sums; a join of
// one job refused for its device does not fail the other job's forming
// ranks, nor takes their free rank; and every door refuses the other job's
// certificates with PERMISSION_DENIED (or, at the coordinator, sees no
// group), changing nothing.

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>

#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "chorus/v1/coordinator.grpc.pb.h"
#include "chorus/v1/worker.grpc.pb.h"
#include "common/net.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/certs.h"
#include "tests/testing/daemons.h"
#include "tests/testing/local_calls.h"
#include "tests/testing/wait.h"

namespace chorus::test {
namespace {

using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;

// The certificates, made once for the suite: they take seconds.
std::string* cert_dir = nullptr;

// The folder of a certificate: "coordinator", "admin-admin", "client-app"
// (the default job's), or "blue/worker-w0" for job blue's.
std::string TlsDir(const std::string& who) {
  const size_t slash = who.find('/');
  if (slash == std::string::npos) return absl::StrCat(*cert_dir, "/", who);
  return absl::StrCat(*cert_dir, "/job-", who.substr(0, slash), "/",
                      who.substr(slash + 1));
}

std::shared_ptr<grpc::Channel> ChannelAs(const std::string& address,
                                         const std::string& who) {
  const PemFiles pem = ReadPemFiles(TlsDir(who));
  grpc::SslCredentialsOptions options;
  options.pem_root_certs = pem.ca;
  options.pem_cert_chain = pem.cert;
  options.pem_private_key = pem.key;
  return grpc::CreateChannel(address, grpc::SslCredentials(options));
}

std::unique_ptr<grpc::ClientContext> Context(
    absl::Duration timeout = kRpcTimeout) {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(DeadlineAfter(timeout));
  return context;
}

class JobsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::string parent = ::testing::TempDir() + "/chorus-jobs-certs-XXXXXX";
    ASSERT_NE(mkdtemp(parent.data()), nullptr);
    absl::StatusOr<std::string> dir =
        MakeDevCerts(parent, {"--admins=admin", "--clients=app"});
    ASSERT_TRUE(dir.ok()) << dir.status();
    for (const char* job : {"blue", "red"}) {
      absl::Status added = AddDevCerts(
          *dir,
          {absl::StrCat("--job=", job), "--workers=w0,w1", "--clients=app"});
      ASSERT_TRUE(added.ok()) << added;
    }
    cert_dir = new std::string(*dir);
  }

  static void TearDownTestSuite() {
    if (cert_dir == nullptr) return;
    std::error_code ignored;
    std::filesystem::remove_all(std::filesystem::path(*cert_dir).parent_path(),
                                ignored);
    delete cert_dir;
    cert_dir = nullptr;
  }

  void SetUp() override {
    ASSERT_NE(cert_dir, nullptr);
    socket_dir_ = "/tmp/chorus-jobs-XXXXXX";
    ASSERT_NE(mkdtemp(socket_dir_.data()), nullptr);
    // Every all-reduce with data through the data plane (same_host), so
    // that each job's ranks must reach their own job's workers.
    absl::StatusOr<Daemon> coordinator = StartCoordinator(
        {absl::StrCat("--tls_dir=", TlsDir("coordinator")),
         "--lease_timeout=60s", "--same_host_inline_max_bytes=0"});
    ASSERT_TRUE(coordinator.ok()) << coordinator.status();
    coordinator_ = *std::move(coordinator);
    for (const std::string job : {"blue", "red"}) {
      for (const std::string name : {"w0", "w1"}) {
        const std::string who = absl::StrCat(job, "/worker-", name);
        absl::StatusOr<Daemon> worker =
            StartWorker(coordinator_.address,
                        {absl::StrCat("--tls_dir=", TlsDir(who)),
                         absl::StrCat("--local_socket=", Socket(job, name))});
        ASSERT_TRUE(worker.ok()) << worker.status();
        workers_[absl::StrCat(job, "/", name)] = *std::move(worker);
      }
    }
    registry_ = Registry();
    ASSERT_EQ(registry_.size(), 4u);
  }

  void TearDown() override {
    workers_.clear();
    std::error_code ignored;
    std::filesystem::remove_all(socket_dir_, ignored);
  }

  std::string Socket(const std::string& job, const std::string& name) const {
    return absl::StrCat(socket_dir_, "/", job, "-", name, ".sock");
  }

  std::unique_ptr<v1::WorkerLocal::Stub> LocalOf(const std::string& job,
                                                 int rank) const {
    return v1::WorkerLocal::NewStub(
        MakeChannel(absl::StrCat("unix:", Socket(job, absl::StrCat("w", rank))),
                    Role::kWorker));
  }

  std::unique_ptr<v1::Coordinator::Stub> CoordinatorAs(
      const std::string& who) const {
    return v1::Coordinator::NewStub(ChannelAs(coordinator_.address, who));
  }

  // The registry as the admin sees it: "job/name id" per worker.
  std::vector<std::string> Registry() const {
    v1::ListWorkersResponse response;
    const grpc::Status status =
        CoordinatorAs("admin-admin")
            ->ListWorkers(Context().get(), v1::ListWorkersRequest(), &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    std::vector<std::string> lines;
    for (const v1::WorkerInfo& w : response.workers()) {
      lines.push_back(absl::StrCat(w.job(), "/", w.name(), " ", w.worker_id()));
    }
    return lines;
  }

  uint64_t WorkerId(const std::string& job_and_name) const {
    for (const std::string& line : registry_) {
      if (line.rfind(job_and_name + " ", 0) == 0) {
        return std::stoull(line.substr(job_and_name.size() + 1));
      }
    }
    ADD_FAILURE() << "no worker " << job_and_name;
    return 0;
  }

  // The groups as the admin sees them: "job/name epoch members" per formed
  // group, "job/name forming joined" per forming one.
  std::vector<std::string> Groups() const {
    v1::ListGroupsResponse response;
    const grpc::Status status =
        CoordinatorAs("admin-admin")
            ->ListGroups(Context().get(), v1::ListGroupsRequest(), &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    std::vector<std::string> lines;
    for (const v1::GroupInfo& g : response.groups()) {
      std::string members;
      for (const v1::GroupMember& m : g.members()) {
        absl::StrAppend(&members, members.empty() ? "" : ",", m.worker_id());
      }
      lines.push_back(
          absl::StrCat(g.job(), "/", g.name(), " formed ", members));
    }
    for (const v1::GroupInfo& g : response.forming()) {
      lines.push_back(
          absl::StrCat(g.job(), "/", g.name(), " forming ", g.members_size()));
    }
    return lines;
  }

  // Joins `group` (world 2) as `rank` through `job`'s worker w<rank>.
  grpc::Status Join(const std::string& job, const std::string& group, int rank,
                    uint64_t* epoch,
                    absl::Duration timeout = kRpcTimeout) const {
    v1::LocalJoinRequest request;
    request.set_group(group);
    request.set_world_size(2);
    request.set_rank(rank);
    v1::LocalJoinResponse response;
    const grpc::Status status = LocalOf(job, rank)->JoinGroup(
        Context(timeout).get(), request, &response);
    if (epoch != nullptr) *epoch = response.epoch();
    return status;
  }

  // Both ranks of `job` join `group` and run an all_reduce sum of one i64,
  // rank r giving (r + 1) * `scale`; returns "OK <sum>" or the error per
  // rank.
  std::vector<std::string> JoinAndSum(const std::string& job,
                                      const std::string& group,
                                      int64_t scale) const {
    std::vector<std::string> results(2);
    std::vector<std::thread> ranks;
    for (int r = 0; r < 2; ++r) {
      ranks.emplace_back([&, r] {
        uint64_t epoch = 0;
        grpc::Status status = Join(job, group, r, &epoch);
        if (!status.ok()) {
          results[r] = status.error_message();
          return;
        }
        v1::LocalCollectiveResponse response;
        status = LocalOf(job, r)->Collective(
            Context().get(), OneI64Sum(group, epoch, r, 1, (r + 1) * scale),
            &response);
        results[r] = SumOrError(status, response);
      });
    }
    for (std::thread& t : ranks) t.join();
    return results;
  }

  Daemon coordinator_;
  std::map<std::string, Daemon> workers_;
  std::string socket_dir_;
  // The registry right after SetUp.
  std::vector<std::string> registry_;
};

TEST_F(JobsTest, Registry_SameNamesInTwoJobs_FourWorkers) {
  EXPECT_THAT(registry_,
              UnorderedElementsAre(HasSubstr("blue/w0 "), HasSubstr("blue/w1 "),
                                   HasSubstr("red/w0 "), HasSubstr("red/w1 ")));
}

TEST_F(JobsTest, AllReduce_SameGroupNameInTwoJobs_EachJobItsOwnSum) {
  std::vector<std::string> blue, red;
  std::thread blue_ranks([&] { blue = JoinAndSum("blue", "train", 1); });
  std::thread red_ranks([&] { red = JoinAndSum("red", "train", 10); });
  blue_ranks.join();
  red_ranks.join();
  EXPECT_THAT(blue, ::testing::ElementsAre("OK 3", "OK 3"));
  EXPECT_THAT(red, ::testing::ElementsAre("OK 30", "OK 30"));
  EXPECT_THAT(Groups(),
              UnorderedElementsAre(
                  absl::StrCat("blue/train formed ", WorkerId("blue/w0"), ",",
                               WorkerId("blue/w1")),
                  absl::StrCat("red/train formed ", WorkerId("red/w0"), ",",
                               WorkerId("red/w1"))));
}

TEST_F(JobsTest, Join_OtherJobRefusedOrWaiting_FormationUnharmed) {
  std::optional<grpc::Status> blue0;
  std::thread waiting([&] { blue0 = Join("blue", "form", 0, nullptr); });
  ASSERT_TRUE(WaitUntil(
      [&] {
        const std::vector<std::string> groups = Groups();
        return groups.size() == 1 && groups[0] == "blue/form forming 1";
      },
      kRpcTimeout));
  // Red's w1 joins as rank 1 with a device the coordinator refuses:
  // without jobs this would fail blue's rank 0 at once.
  v1::JoinGroupRequest join;
  join.set_group("form");
  join.set_world_size(2);
  join.set_rank(1);
  join.set_worker_id(WorkerId("red/w1"));
  join.mutable_device()->set_kind(v1::DEVICE_KIND_VULKAN);
  v1::JoinGroupResponse joined;
  const grpc::Status refused =
      CoordinatorAs("red/worker-w1")->JoinGroup(Context().get(), join, &joined);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNIMPLEMENTED)
      << refused.error_message();
  EXPECT_THAT(refused.error_message(),
              HasSubstr("Distributed operations are not supported for device "
                        "Vulkan(0)"));
  // Red's rank 1 on its CPU waits in red's own "form", not in blue's free
  // rank 1.
  const grpc::Status alone = Join("red", "form", 1, nullptr, absl::Seconds(2));
  EXPECT_EQ(alone.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED)
      << alone.error_message();
  uint64_t epoch = 0;
  const grpc::Status blue1 = Join("blue", "form", 1, &epoch);
  waiting.join();
  ASSERT_TRUE(blue0.has_value());
  EXPECT_TRUE(blue0->ok()) << blue0->error_message();
  EXPECT_TRUE(blue1.ok()) << blue1.error_message();
  EXPECT_THAT(Groups(), ::testing::Contains(absl::StrCat(
                            "blue/form formed ", WorkerId("blue/w0"), ",",
                            WorkerId("blue/w1"))));
}

TEST_F(JobsTest, Doors_OtherJobsCertificates_PermissionDeniedNothingChanged) {
  ASSERT_THAT(JoinAndSum("blue", "train", 1),
              ::testing::ElementsAre("OK 3", "OK 3"));
  const std::string blue_w0 = workers_.at("blue/w0").address;

  // A worker's local API over TCP: clients of its own job, and admins, who
  // serve every job; not clients of another job (the default job is a job
  // too).
  v1::LocalJoinRequest solo;
  solo.set_group("solo");
  solo.set_world_size(1);
  for (const std::string who : {"blue/client-app", "admin-admin"}) {
    v1::LocalJoinResponse response;
    const grpc::Status status =
        v1::WorkerLocal::NewStub(ChannelAs(blue_w0, who))
            ->JoinGroup(Context().get(), solo, &response);
    EXPECT_TRUE(status.ok()) << who << ": " << status.error_message();
  }
  const std::vector<std::string> groups = Groups();
  for (const std::string who : {"red/client-app", "client-app"}) {
    v1::LocalJoinResponse response;
    const grpc::Status status =
        v1::WorkerLocal::NewStub(ChannelAs(blue_w0, who))
            ->JoinGroup(Context().get(), solo, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED) << who;
    EXPECT_THAT(status.error_message(), HasSubstr("serves job \"blue\" here"))
        << who;
  }

  // The data plane: workers of its own job only.
  v1::DataPlaneInfo info;
  const grpc::Status peer =
      v1::Peer::NewStub(ChannelAs(blue_w0, "red/worker-w0"))
          ->DataPlane(Context().get(), v1::DataPlaneRequest(), &info);
  EXPECT_EQ(peer.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(peer.error_message(), HasSubstr("serves job \"blue\" here"));

  // The coordinator: red's w0 may not act for blue's w0 (same name) ...
  auto as_red_w0 = CoordinatorAs("red/worker-w0");
  v1::HeartbeatRequest heartbeat;
  heartbeat.set_worker_id(WorkerId("blue/w0"));
  heartbeat.set_incarnation(1);
  v1::HeartbeatResponse beat;
  const grpc::Status foreign_beat =
      as_red_w0->Heartbeat(Context().get(), heartbeat, &beat);
  EXPECT_EQ(foreign_beat.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(foreign_beat.error_message(),
              HasSubstr("of job red may not act"));
  // ... and sees no group "train" of blue's: its calls go to red's groups.
  v1::CollectiveRequest call;
  call.set_group("train");
  call.set_epoch(1);
  call.set_rank(0);
  call.set_sequence(2);
  v1::CollectiveResponse answer;
  const grpc::Status foreign_call =
      as_red_w0->Collective(Context().get(), call, &answer);
  EXPECT_EQ(foreign_call.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(foreign_call.error_message(),
              HasSubstr("unknown group \"train\""));

  // Nothing changed: the registry and blue's group (no call pending on it).
  EXPECT_EQ(Registry(), registry_);
  EXPECT_EQ(Groups(), groups);
}

}  // namespace
}  // namespace chorus::test
