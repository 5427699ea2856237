// The daemons' HTTP port against real processes: /metrics moves when a ring
// all-reduce runs, Debian's Prometheus scrapes it and answers a query for
// it, headless Chromium renders the coordinator's status page, and the
// port follows the security rules (loopback only without TLS; with TLS,
// HTTPS for admin and client certificates only). The Prometheus and
// Chromium cases skip themselves where those programs are not installed.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/tcp_socket.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "tests/testing/certs.h"
#include "tests/testing/daemons.h"
#include "tests/testing/http_get.h"
#include "tests/testing/process.h"
#include "tests/testing/wait.h"

namespace chorus::test {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// Generous: a loaded two-core machine may take long to start a browser or
// to scrape.
constexpr absl::Duration kObserveTimeout = absl::Seconds(90);

// Returns the path of `program` on the PATH, or "" when it is not there.
std::string FindProgram(const std::string& program) {
  const char* path = getenv("PATH");
  for (absl::string_view dir :
       absl::StrSplit(path == nullptr ? "" : path, ':')) {
    const std::string candidate = absl::StrCat(dir, "/", program);
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

// A coordinator and two workers, each with its HTTP port on loopback.
class ObservabilityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    socket_dir_ = "/tmp/chorus-observe-XXXXXX";
    ASSERT_NE(mkdtemp(socket_dir_.data()), nullptr);
    const std::string port_file =
        NewScratchPath("coordinator-metrics", ".port");
    absl::StatusOr<Daemon> coordinator =
        StartCoordinator({"--metrics_listen=127.0.0.1:0",
                          absl::StrCat("--metrics_port_file=", port_file)});
    ASSERT_TRUE(coordinator.ok()) << coordinator.status();
    coordinator_ = *std::move(coordinator);
    coordinator_metrics_ = ReadPort(port_file);
    ASSERT_GT(coordinator_metrics_, 0);
    for (int w = 0; w < 2; ++w) {
      const std::string worker_port =
          NewScratchPath(absl::StrCat("worker-metrics-", w), ".port");
      absl::StatusOr<Daemon> worker = StartWorker(
          coordinator_.address,
          {absl::StrCat("--name=obs-", w), "--metrics_listen=127.0.0.1:0",
           absl::StrCat("--metrics_port_file=", worker_port),
           absl::StrCat("--local_socket=", Socket(w))});
      ASSERT_TRUE(worker.ok()) << worker.status();
      workers_.push_back(*std::move(worker));
      worker_metrics_.push_back(ReadPort(worker_port));
    }
  }

  void TearDown() override {
    workers_.clear();
    std::error_code ignored;
    std::filesystem::remove_all(socket_dir_, ignored);
  }

  std::string Socket(int w) const {
    return absl::StrCat(socket_dir_, "/w", w, ".sock");
  }

  // Runs an all-reduce on both ranks of `group` with `algorithm`.
  void AllReduce(const std::string& group, const std::string& algorithm) {
    std::vector<std::unique_ptr<Subprocess>> ranks;
    for (int r = 0; r < 2; ++r) {
      SubprocessOptions options;
      options.binary = ChorusctlBinary();
      options.args = {absl::StrCat("--worker=unix:", Socket(r)),
                      absl::StrCat("--group=", group),
                      "--world=2",
                      absl::StrCat("--rank=", r),
                      "--dtype=f32",
                      "--op=sum",
                      absl::StrCat("--algorithm=", algorithm),
                      "--timeout=60s",
                      "allreduce",
                      "1",
                      "2",
                      "3",
                      "4"};
      options.stdout_path = NewScratchPath(absl::StrCat("rank-", r), ".log");
      absl::StatusOr<std::unique_ptr<Subprocess>> rank =
          Subprocess::Start(options);
      ASSERT_TRUE(rank.ok()) << rank.status();
      ranks.push_back(*std::move(rank));
    }
    for (auto& rank : ranks) {
      absl::StatusOr<int> exit_code = rank->WaitForExit(kObserveTimeout);
      ASSERT_TRUE(exit_code.ok()) << exit_code.status();
      EXPECT_EQ(*exit_code, 0);
    }
  }

  std::string socket_dir_;
  Daemon coordinator_;
  int coordinator_metrics_ = 0;
  std::vector<Daemon> workers_;
  std::vector<int> worker_metrics_;
};

TEST_F(ObservabilityTest, Metrics_RingAllReduce_CountersMoveOnEveryDaemon) {
  const std::string before = HttpGet(coordinator_metrics_, "/metrics");
  EXPECT_THAT(before, HasSubstr("chorus_workers 2\n"));
  EXPECT_THAT(before, Not(HasSubstr("kind=\"all_reduce\"")));
  AllReduce("observed", "ring");

  const std::string coordinator = HttpGet(coordinator_metrics_, "/metrics");
  EXPECT_THAT(coordinator,
              HasSubstr("# TYPE chorus_collectives_total counter\n"));
  EXPECT_THAT(coordinator,
              HasSubstr("chorus_collectives_total{kind=\"all_reduce\","
                        "plan=\"ring\",code=\"OK\"} 1\n"));
  EXPECT_THAT(coordinator,
              HasSubstr("chorus_collective_seconds_count{kind=\"all_reduce\","
                        "size=\"1KiB\"} 1\n"));
  EXPECT_THAT(coordinator, HasSubstr("chorus_groups{state=\"active\"} 1\n"));
  EXPECT_THAT(coordinator, HasSubstr("chorus_worker_registrations_total 2\n"));

  const std::string worker = HttpGet(worker_metrics_[0], "/metrics");
  EXPECT_THAT(worker, HasSubstr("chorus_collectives_total{kind=\"all_reduce\","
                                "plan=\"ring\",code=\"OK\"} 1\n"));
  // Four f32 values: rank 0 sends its peer (named) half of them twice.
  EXPECT_THAT(worker, HasSubstr("chorus_peer_sent_bytes_total{peer=\"obs-1\"} "
                                "16\n"));
  EXPECT_THAT(worker,
              HasSubstr("chorus_peer_received_bytes_total{peer=\"obs-1\"} "
                        "16\n"));
  EXPECT_THAT(worker,
              HasSubstr("chorus_reduce_bytes_total{engine=\"cpu\"} 8\n"));
  EXPECT_THAT(
      worker,
      HasSubstr("chorus_data_plane_connections{direction=\"out\"} 1\n"));
}

TEST_F(ObservabilityTest, Prometheus_ScrapesTheDaemons_QueryAnswersTheRing) {
  const std::string prometheus = FindProgram("prometheus");
  if (prometheus.empty()) {
    GTEST_SKIP() << "prometheus is not installed (scripts/setup.sh installs "
                    "Debian's)";
  }
  AllReduce("scraped", "ring");
  // A free port for Prometheus's own HTTP API.
  absl::StatusOr<Listener> probe = ListenTcp("127.0.0.1", 0);
  ASSERT_TRUE(probe.ok()) << probe.status();
  const int api_port = probe->port;
  close(probe->fd);
  const std::string config = NewScratchPath("prometheus", ".yml");
  {
    std::ofstream out(config);
    out << "global:\n  scrape_interval: 1s\nscrape_configs:\n"
        << "  - job_name: chorus\n    static_configs:\n"
        << "      - targets: ['127.0.0.1:" << coordinator_metrics_
        << "', '127.0.0.1:" << worker_metrics_[0] << "']\n";
  }
  const std::string data = NewScratchPath("prometheus-data", "");
  SubprocessOptions options;
  options.binary = prometheus;
  options.args = {absl::StrCat("--config.file=", config),
                  absl::StrCat("--storage.tsdb.path=", data),
                  absl::StrCat("--web.listen-address=127.0.0.1:", api_port)};
  options.stdout_path = NewScratchPath("prometheus", ".log");
  absl::StatusOr<std::unique_ptr<Subprocess>> server =
      Subprocess::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string query =
      "/api/v1/query?query=chorus_collectives_total%7Bkind%3D%22all_reduce%22"
      "%2Cplan%3D%22ring%22%7D";
  std::string answer;
  const bool answered = WaitUntil(
      [&] {
        answer = HttpGet(api_port, query);
        // One series from the coordinator, one from the worker.
        return absl::StrContains(answer,
                                 "\"instance\":\"127.0.0.1:" +
                                     std::to_string(coordinator_metrics_)) &&
               absl::StrContains(answer,
                                 "\"instance\":\"127.0.0.1:" +
                                     std::to_string(worker_metrics_[0]));
      },
      kObserveTimeout, absl::Milliseconds(250));
  EXPECT_TRUE(answered) << "last answer: " << answer;
  EXPECT_THAT(answer, HasSubstr("\"status\":\"success\""));
  EXPECT_THAT(answer, HasSubstr("\"code\":\"OK\""));
  EXPECT_THAT(answer, HasSubstr(",\"1\"]"));  // the value: one call
}

TEST_F(ObservabilityTest, StatusPage_HeadlessChromium_ShowsTheCluster) {
  const std::string chromium = FindProgram("chromium");
  if (chromium.empty()) {
    GTEST_SKIP() << "chromium is not installed (scripts/setup.sh installs "
                    "Debian's)";
  }
  AllReduce("paged", "ring");
  const std::string profile = NewScratchPath("chromium-profile", "");
  absl::StatusOr<CommandResult> dom = RunCommand(
      chromium,
      {"--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
       absl::StrCat("--user-data-dir=", profile), "--dump-dom",
       absl::StrCat("http://127.0.0.1:", coordinator_metrics_, "/")},
      kObserveTimeout);
  ASSERT_TRUE(dom.ok()) << dom.status();
  ASSERT_EQ(dom->exit_code, 0) << dom->err;
  EXPECT_THAT(dom->out, HasSubstr("<title>Chorus coordinator</title>"));
  EXPECT_THAT(dom->out, HasSubstr("2 workers, 1 groups"));
  EXPECT_THAT(dom->out, HasSubstr("<td>obs-0</td>"));
  EXPECT_THAT(dom->out, HasSubstr("0: obs-0 Cpu; 1: obs-1 Cpu"));
  EXPECT_THAT(dom->out, HasSubstr("<td>#1</td><td>all_reduce f32[4] sum</td>"
                                  "<td>ring</td><td>OK</td>"));
}

TEST_F(ObservabilityTest, Groups_RankWaitsInJoin_ListedAsForming) {
  SubprocessOptions options;
  options.binary = ChorusctlBinary();
  options.args = {absl::StrCat("--worker=unix:", Socket(0)),
                  "--group=half",
                  "--world=2",
                  "--rank=0",
                  "--timeout=120s",
                  "barrier"};
  options.stdout_path = NewScratchPath("waiting-rank", ".log");
  absl::StatusOr<std::unique_ptr<Subprocess>> waiting =
      Subprocess::Start(options);
  ASSERT_TRUE(waiting.ok()) << waiting.status();
  const std::vector<std::string> base = {
      absl::StrCat("--coordinator=", coordinator_.address), "--timeout=10s"};
  auto run = [&](const std::string& command) {
    std::vector<std::string> args = base;
    args.push_back(command);
    absl::StatusOr<CommandResult> result = RunChorusctl(args);
    return result.ok() && result->exit_code == 0 ? result->out : "";
  };
  std::string groups;
  EXPECT_TRUE(WaitUntil(
      [&] {
        groups = run("groups");
        return absl::StrContains(groups,
                                 "group half: forming, world 2, 1 "
                                 "joined; waiting ");
      },
      kObserveTimeout, absl::Milliseconds(100)))
      << groups;
  EXPECT_THAT(groups, HasSubstr("ms for rank 1 to join"));
  EXPECT_THAT(groups, HasSubstr("rank 0: worker "));
  EXPECT_THAT(groups, HasSubstr("\"obs-0\" joined"));
  EXPECT_THAT(run("stalls"), HasSubstr("group half: forming"));
  EXPECT_THAT(HttpGet(coordinator_metrics_, "/"),
              HasSubstr("<td>half</td><td>2</td><td>0: obs-0</td>"));
}

TEST(ObservabilitySecurityTest, MetricsListen_NetworkWithoutTls_Refused) {
  absl::StatusOr<Daemon> coordinator =
      StartCoordinator({"--metrics_listen=0.0.0.0:0"});
  ASSERT_FALSE(coordinator.ok());
  EXPECT_THAT(coordinator.status().message(), HasSubstr("--metrics_listen"));
  EXPECT_THAT(coordinator.status().message(), HasSubstr("--insecure"));
}

TEST(ObservabilitySecurityTest,
     MetricsOverTls_AdminAnsweredWorkerRefusedStatusPageAdminOnly) {
  // The refused handshakes below close the connection under the client's
  // writes, which OpenSSL makes with write(2).
  signal(SIGPIPE, SIG_IGN);
  std::string parent = ::testing::TempDir() + "/chorus-observe-certs-XXXXXX";
  ASSERT_NE(mkdtemp(parent.data()), nullptr);
  absl::StatusOr<std::string> certs = MakeDevCerts(
      parent,
      {"--workers=w0", "--admins=admin", "--clients=app", "--hosts=127.0.0.1"});
  ASSERT_TRUE(certs.ok()) << certs.status();
  const std::string port_file = NewScratchPath("tls-metrics", ".port");
  absl::StatusOr<Daemon> coordinator =
      StartCoordinator({absl::StrCat("--tls_dir=", *certs, "/coordinator"),
                        "--metrics_listen=127.0.0.1:0",
                        absl::StrCat("--metrics_port_file=", port_file)});
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  const int port = ReadPort(port_file);

  auto get = [&](const std::string& identity,
                 const std::string& path = "/metrics") -> httplib::Result {
    const std::string dir = absl::StrCat(*certs, "/", identity);
    httplib::SSLClient client("127.0.0.1", port,
                              identity.empty() ? "" : dir + "/cert.pem",
                              identity.empty() ? "" : dir + "/key.pem");
    client.set_ca_cert_path((*certs + "/coordinator/ca.pem").c_str());
    client.enable_server_certificate_verification(true);
    client.set_connection_timeout(10);
    client.set_read_timeout(10);
    return client.Get(path);
  };
  httplib::Result admin = get("admin-admin");
  ASSERT_TRUE(admin) << httplib::to_string(admin.error());
  EXPECT_EQ(admin->status, 200);
  EXPECT_THAT(admin->body, HasSubstr("chorus_workers 0\n"));
  httplib::Result worker = get("worker-w0");
  ASSERT_TRUE(worker) << httplib::to_string(worker.error());
  EXPECT_EQ(worker->status, 403);
  EXPECT_THAT(worker->body, HasSubstr("chorus://worker/w0"));
  // A client may scrape, but the status page (workers, groups, verdicts)
  // is for admins, as ListWorkers is.
  httplib::Result client = get("client-app");
  ASSERT_TRUE(client) << httplib::to_string(client.error());
  EXPECT_EQ(client->status, 200);
  httplib::Result client_page = get("client-app", "/");
  ASSERT_TRUE(client_page) << httplib::to_string(client_page.error());
  EXPECT_EQ(client_page->status, 403);
  EXPECT_THAT(client_page->body, HasSubstr("GET / needs an admin certificate"));
  httplib::Result admin_page = get("admin-admin", "/");
  ASSERT_TRUE(admin_page) << httplib::to_string(admin_page.error());
  EXPECT_EQ(admin_page->status, 200);
  EXPECT_THAT(admin_page->body, HasSubstr("Chorus coordinator"));
  // No client certificate: the handshake fails.
  EXPECT_FALSE(get(""));
  // Plain HTTP to the HTTPS port gets nothing.
  EXPECT_EQ(HttpGet(port, "/metrics"), "");
  // 300 connections that never start their handshake hold no thread: an
  // admin's scrape is answered beside them (within its 10 s timeout; with a
  // thread per handshake it waited for them).
  std::vector<int> silent;
  for (int i = 0; i < 300; ++i) {
    absl::StatusOr<int> fd =
        ConnectTcp("127.0.0.1", port, absl::Now() + absl::Seconds(30));
    ASSERT_TRUE(fd.ok()) << fd.status();
    silent.push_back(*fd);
  }
  httplib::Result during_flood = get("admin-admin");
  ASSERT_TRUE(during_flood) << httplib::to_string(during_flood.error());
  EXPECT_EQ(during_flood->status, 200);
  for (int fd : silent) CloseSocket(fd);
  std::error_code ignored;
  std::filesystem::remove_all(parent, ignored);
}

// The metrics port's TLS is the daemon's OpenSSL context, rebuilt when its
// files change: a CA bundle rewritten on disk lets an admin of the added CA
// scrape without a restart.
TEST(ObservabilitySecurityTest, MetricsOverTls_CaReplacedOnDisk_NewCaAccepted) {
  signal(SIGPIPE, SIG_IGN);
  std::string parent = ::testing::TempDir() + "/chorus-observe-ca-XXXXXX";
  ASSERT_NE(mkdtemp(parent.data()), nullptr);
  absl::StatusOr<std::string> certs =
      MakeDevCerts(parent, {"--admins=admin", "--hosts=127.0.0.1"});
  ASSERT_TRUE(certs.ok()) << certs.status();
  absl::StatusOr<std::string> other =
      MakeDevCerts(parent, {"--admins=admin", "--hosts=127.0.0.1"});
  ASSERT_TRUE(other.ok()) << other.status();
  // A coordinator of its own whose CA file the test rewrites.
  const std::string dir = NewScratchPath("coordinator-tls", "");
  std::filesystem::create_directories(dir);
  for (const char* file : {"ca.pem", "cert.pem", "key.pem"}) {
    std::filesystem::copy_file(*certs + "/coordinator/" + file,
                               dir + "/" + file);
  }
  const std::string port_file = NewScratchPath("tls-metrics", ".port");
  absl::StatusOr<Daemon> coordinator =
      StartCoordinator({absl::StrCat("--tls_dir=", dir), "--tls_refresh=1s",
                        "--metrics_listen=127.0.0.1:0",
                        absl::StrCat("--metrics_port_file=", port_file)});
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  // The other CA's admin, trusting this coordinator's CA.
  auto scrape = [&]() -> int {
    const std::string admin = *other + "/admin-admin";
    httplib::SSLClient client("127.0.0.1", ReadPort(port_file),
                              admin + "/cert.pem", admin + "/key.pem");
    client.set_ca_cert_path((*certs + "/coordinator/ca.pem").c_str());
    client.enable_server_certificate_verification(true);
    client.set_connection_timeout(10);
    client.set_read_timeout(10);
    httplib::Result result = client.Get("/metrics");
    return result ? result->status : 0;
  };
  EXPECT_EQ(scrape(), 0);  // its certificate's CA is not trusted yet
  {
    std::ofstream bundle(dir + "/ca.pem.new");
    bundle << ReadPemFiles(*certs + "/coordinator").ca
           << ReadPemFiles(*other + "/admin-admin").ca;
  }
  std::filesystem::rename(dir + "/ca.pem.new", dir + "/ca.pem");
  EXPECT_TRUE(WaitUntil([&] { return scrape() == 200; }, absl::Seconds(30)));
  std::error_code ignored;
  std::filesystem::remove_all(parent, ignored);
}

}  // namespace
}  // namespace chorus::test
