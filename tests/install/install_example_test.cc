// Chorus installed as a new user installs it: `cmake --install` of this
// build (nothing is rebuilt) into a temporary prefix, then
// - examples/cpp configured and built on its own against that prefix
//   (find_package(Chorus), Chorus::client) and run as the two ranks of a
//   group through the installed coordinator and workers;
// - a program built with nothing but `pkg-config chorus`;
// - the installed systemd units, whose ExecStart must name the installed
//   binaries with flags they take and variables the example flags file
//   sets;
// - the Debian packages CPack makes of the same install (what
//   deploy/Dockerfile installs): their files, the units' paths under /usr,
//   the shared libraries they depend on, and that apt would install them;
// - the Python wheel, which must carry the embedded worker: installed into
//   a folder of its own, a rank embeds the worker and all-reduces.
// Each case installs afresh (well under a second); the example's build and
// CPack's packing are the costs.

#include <stdlib.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/daemons.h"
#include "tests/testing/process.h"

namespace chorus::test {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// Installing copies and strips three programs and a library; building the
// example compiles one file (on a cold cache, the public headers and
// Abseil's).
constexpr absl::Duration kInstallTimeout = absl::Seconds(120);
constexpr absl::Duration kBuildTimeout = absl::Seconds(240);
constexpr absl::Duration kRankTimeout = absl::Seconds(60);

// Runs `args` (args[0] the program) and expects it to exit 0 within
// `timeout`; returns what it printed, stdout then stderr.
std::string RunOk(const std::vector<std::string>& args,
                  absl::Duration timeout) {
  absl::StatusOr<CommandResult> ran =
      RunCommand(args[0], {args.begin() + 1, args.end()}, timeout);
  EXPECT_TRUE(ran.ok()) << args[0] << ": " << ran.status();
  if (!ran.ok()) return "";
  EXPECT_EQ(ran->exit_code, 0) << absl::StrJoin(args, " ") << "\n"
                               << ran->out << ran->err;
  return ran->out + ran->err;
}

bool IsExecutable(const std::string& path) {
  struct stat info;
  return stat(path.c_str(), &info) == 0 && S_ISREG(info.st_mode) &&
         (info.st_mode & S_IXUSR) != 0;
}

class InstallTest : public ::testing::Test {
 protected:
  void SetUp() override {
    prefix_ = ScratchDir() + "/prefix";
    RunOk({CHORUS_CMAKE, "--install", CHORUS_BUILD_DIR, "--prefix", prefix_},
          kInstallTimeout);
  }

  std::string Installed(const std::string& path) const {
    return absl::StrCat(prefix_, "/", path);
  }

  std::string prefix_;
};

TEST_F(InstallTest, CmakePackage_CppExample_BuildsAndRunsTwoRanks) {
  ASSERT_FALSE(HasFailure());
  // The example's own build, as its CMakeLists.txt says, with only the
  // prefix to find Chorus in (and this build's compiler and cache).
  const std::string build = ScratchDir() + "/example";
  std::vector<std::string> configure = {
      CHORUS_CMAKE,
      "-S",
      absl::StrCat(CHORUS_SOURCE_DIR, "/examples/cpp"),
      "-B",
      build,
      "-G",
      CHORUS_GENERATOR,
      absl::StrCat("-DCMAKE_PREFIX_PATH=", prefix_),
      absl::StrCat("-DCMAKE_CXX_COMPILER=", CHORUS_CXX),
      "-DCMAKE_BUILD_TYPE=Release"};
  if (!std::string(CHORUS_CCACHE).empty()) {
    configure.push_back(
        absl::StrCat("-DCMAKE_CXX_COMPILER_LAUNCHER=", CHORUS_CCACHE));
  }
  const absl::Time start = absl::Now();
  RunOk(configure, kBuildTimeout);
  RunOk({CHORUS_CMAKE, "--build", build}, kBuildTimeout);
  std::printf("[ time     ] the example configured and built in %s\n",
              absl::FormatDuration(absl::Now() - start).c_str());
  ASSERT_FALSE(HasFailure());

  // The installed daemons: a coordinator and a worker per rank, each with
  // its own local socket (short paths: a socket address is small).
  std::string sockets = "/tmp/chorus-ex-XXXXXX";
  ASSERT_NE(mkdtemp(sockets.data()), nullptr);
  const std::string coordinator_port = NewScratchPath("coordinator", ".port");
  absl::StatusOr<Daemon> coordinator = StartDaemonCommand(
      {Installed("bin/chorus-coordinator"), "--listen=127.0.0.1:0",
       "--port_file=" + coordinator_port},
      coordinator_port, "coordinator");
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  std::vector<Daemon> workers;
  for (int rank = 0; rank < 2; ++rank) {
    const std::string port = NewScratchPath("worker", ".port");
    absl::StatusOr<Daemon> worker = StartDaemonCommand(
        {Installed("bin/chorus-worker"),
         "--coordinator=" + coordinator->address, "--listen=127.0.0.1:0",
         absl::StrCat("--name=worker-", rank), "--port_file=" + port,
         absl::StrCat("--local_socket=", sockets, "/", rank, ".sock")},
        port, absl::StrCat("worker-", rank));
    ASSERT_TRUE(worker.ok()) << worker.status();
    workers.push_back(*std::move(worker));
  }

  std::vector<std::unique_ptr<Subprocess>> ranks;
  for (int rank = 0; rank < 2; ++rank) {
    SubprocessOptions options;
    options.binary = build + "/chorus_example";
    options.args = {absl::StrCat("unix:", sockets, "/", rank, ".sock"),
                    "example", "2", absl::StrCat(rank)};
    options.stdout_path = NewScratchPath(absl::StrCat("rank-", rank), ".out");
    options.stderr_path = NewScratchPath(absl::StrCat("rank-", rank), ".err");
    absl::StatusOr<std::unique_ptr<Subprocess>> started =
        Subprocess::Start(options);
    ASSERT_TRUE(started.ok()) << started.status();
    ranks.push_back(*std::move(started));
  }
  for (int rank = 0; rank < 2; ++rank) {
    absl::StatusOr<int> code = ranks[rank]->WaitForExit(kRankTimeout);
    ASSERT_TRUE(code.ok()) << "rank " << rank << ": " << code.status();
    EXPECT_EQ(*code, 0) << "rank " << rank << ": " << ranks[rank]->ReadStderr();
    const std::string out = ranks[rank]->ReadLog();
    EXPECT_THAT(out, HasSubstr(absl::StrCat("rank ", rank,
                                            " of 2 joined group example")));
    EXPECT_THAT(out, HasSubstr("all_reduce sum: 3 30\n"));
    EXPECT_THAT(out, HasSubstr("all_gather (asynchronous, #2): 0 0 1 1\n"));
    EXPECT_THAT(out, HasSubstr("typed error: INVALID_ARGUMENT, reason "
                               "MISMATCH, call #3\n"
                               "  rank 0 asked for all_reduce f32[1] sum\n"
                               "  rank 1 asked for all_reduce f32[2] sum\n"));
    EXPECT_THAT(out, HasSubstr("barrier: ok\n"));
  }
  workers.clear();
  std::error_code ignored;
  std::filesystem::remove_all(sockets, ignored);
}

TEST_F(InstallTest, PkgConfig_ProgramCompiledWithItsFlags_LinksAndRuns) {
  ASSERT_FALSE(HasFailure());
  const std::string source = ScratchDir() + "/uses_chorus.cc";
  std::ofstream(source) << R"(#include <chorus/communicator.h>
#include <chorus/status_facts.h>
#include <iostream>
int main() {
  chorus::JoinOptions options;
  options.timeout = absl::Seconds(2);
  auto joined = chorus::Communicator::JoinThroughDaemon(
      "unix:/nonexistent/worker.sock", "g", 1, 0, options);
  std::cout << absl::StatusCodeToString(joined.status().code()) << " "
            << chorus::StatusFactsOf(joined.status()).has_value() << "\n";
}
)";
  const std::string program = ScratchDir() + "/uses_chorus";
  const std::string out = RunOk(
      {"/usr/bin/env",
       absl::StrCat("PKG_CONFIG_PATH=", Installed("lib/pkgconfig")), "sh", "-c",
       absl::StrCat(CHORUS_CXX, " -std=c++17 -o ", program, " ", source,
                    " $(pkg-config --cflags --libs chorus) -Wl,-rpath,",
                    Installed("lib"), " && ", program)},
      kBuildTimeout);
  EXPECT_THAT(out, HasSubstr("UNAVAILABLE 0\n"));
}

TEST_F(InstallTest, SystemdUnits_ExecStart_InstalledBinaryFlagsAndVariables) {
  ASSERT_FALSE(HasFailure());
  absl::StatusOr<std::string> env =
      ReadFileToString(Installed("share/chorus/chorus.env.example"));
  ASSERT_TRUE(env.ok()) << env.status();
  for (const std::string program : {"chorus-coordinator", "chorus-worker"}) {
    SCOPED_TRACE(program);
    absl::StatusOr<std::string> unit = ReadFileToString(
        Installed(absl::StrCat("lib/systemd/system/", program, ".service")));
    ASSERT_TRUE(unit.ok()) << unit.status();
    std::string exec;
    for (absl::string_view line : absl::StrSplit(*unit, '\n')) {
      if (absl::ConsumePrefix(&line, "ExecStart=")) exec = std::string(line);
    }
    const std::vector<std::string> words = absl::StrSplit(exec, ' ');
    ASSERT_FALSE(words.empty()) << *unit;
    EXPECT_EQ(words[0], Installed("bin/" + program));
    EXPECT_TRUE(IsExecutable(words[0])) << words[0];
    // --helpfull exits 1, as Abseil's help does.
    absl::StatusOr<CommandResult> help =
        RunCommand(words[0], {"--helpfull"}, kRankTimeout);
    ASSERT_TRUE(help.ok()) << help.status();
    for (size_t i = 1; i < words.size(); ++i) {
      absl::string_view word = words[i];
      ASSERT_TRUE(absl::ConsumePrefix(&word, "--")) << word;
      const std::string flag(word.substr(0, word.find('=')));
      EXPECT_THAT(help->out + help->err,
                  HasSubstr(absl::StrCat("--", flag, " (")))
          << flag;
      absl::string_view value = word.substr(word.find('=') + 1);
      if (absl::ConsumePrefix(&value, "${") &&
          absl::ConsumeSuffix(&value, "}")) {
        EXPECT_THAT(*env, HasSubstr(absl::StrCat("\n", value, "=")))
            << "chorus.env.example does not set " << value;
      }
    }
  }
}

// Runs `command` through the shell; returns its stdout, "" on failure.
std::string Shell(const std::string& command) {
  absl::StatusOr<CommandResult> ran =
      RunCommand("/bin/sh", {"-c", command}, kBuildTimeout);
  EXPECT_TRUE(ran.ok()) << command << ": " << ran.status();
  if (!ran.ok()) return "";
  EXPECT_EQ(ran->exit_code, 0) << command << "\n" << ran->err;
  return ran->out;
}

TEST_F(InstallTest, CpackDeb_ThreePackages_FilesUnitsAndDependencies) {
  ASSERT_FALSE(HasFailure());
  for (const char* tool : {"dpkg-deb", "dpkg-shlibdeps", "file"}) {
    if (Shell(absl::StrCat("command -v ", tool, " || true")).empty()) {
      GTEST_SKIP() << tool << " is missing (scripts/setup.sh installs it)";
    }
  }
  const std::string out = ScratchDir() + "/packages";
  RunOk({"/bin/sh", "-c",
         absl::StrCat("cd ", CHORUS_BUILD_DIR, " && cpack -G DEB -B ", out,
                      " >/dev/null")},
        kBuildTimeout);
  ASSERT_FALSE(HasFailure());
  const std::string daemons = out + "/chorus_*.deb";
  const std::string library = out + "/libchorus0_*.deb";
  const std::string dev = out + "/libchorus-dev_*.deb";

  const std::string daemon_files = Shell("dpkg-deb -c " + daemons);
  for (const std::string path :
       {"./usr/bin/chorus-coordinator", "./usr/bin/chorus-worker",
        "./usr/bin/chorusctl", "./usr/lib/systemd/system/chorus-worker.service",
        "./usr/lib/systemd/system/chorus-coordinator.service",
        "./usr/share/chorus/chorus.env.example"}) {
    EXPECT_THAT(daemon_files, HasSubstr(path));
  }
  EXPECT_THAT(
      Shell("dpkg-deb --fsys-tarfile " + daemons +
            " | tar -xO ./usr/lib/systemd/system/chorus-worker.service"),
      HasSubstr("\nExecStart=/usr/bin/chorus-worker "));
  // dpkg-shlibdeps' dependencies: the image needs no list of its own.
  const std::string depends = Shell("dpkg-deb -f " + daemons + " Depends");
  for (const std::string package :
       {"passwd", "libgrpc++1.51", "libprotobuf32", "libgoogle-glog0v6",
        "libssl3", "libabsl20220623"}) {
    EXPECT_THAT(depends, HasSubstr(package));
  }
  // The metrics port is Chorus's own event loop: no HTTP library.
  EXPECT_THAT(depends, Not(HasSubstr("httplib")));
  EXPECT_THAT(Shell("dpkg-deb -I " + daemons), HasSubstr("postinst"));

  EXPECT_THAT(Shell("dpkg-deb -c " + library),
              HasSubstr("./usr/lib/libchorus.so.0"));
  const std::string dev_files = Shell("dpkg-deb -c " + dev);
  for (const std::string path :
       {"./usr/include/chorus/communicator.h", "./usr/lib/libchorus.so",
        "./usr/lib/cmake/Chorus/ChorusConfig.cmake",
        "./usr/lib/pkgconfig/chorus.pc"}) {
    EXPECT_THAT(dev_files, HasSubstr(path));
  }
  EXPECT_THAT(Shell("dpkg-deb -f " + dev + " Depends"),
              HasSubstr("libchorus0 (= "));
  // apt would install all three here, with what they depend on.
  if (!Shell("command -v apt-get || true").empty()) {
    EXPECT_THAT(Shell(absl::StrCat("apt-get install -s ", daemons, " ", library,
                                   " ", dev)),
                HasSubstr("Conf libchorus-dev"));
  }
}

#ifdef CHORUS_PYTHON
TEST_F(InstallTest, PythonWheel_InstalledAlone_EmbeddedWorkerAllReduces) {
  ASSERT_FALSE(HasFailure());
  // What the target python-wheel runs, into a folder of this test's.
  const std::string dist = ScratchDir() + "/dist";
  RunOk(
      {"/usr/bin/env", absl::StrCat("CHORUS_BUILD_DIR=", CHORUS_BUILD_DIR),
       "CHORUS_REQUIRE_EMBEDDED=1", CHORUS_PYTHON, "-m", "pip", "wheel",
       "--quiet", "--no-deps", "--no-build-isolation", "--no-index",
       "--wheel-dir", dist, absl::StrCat(CHORUS_SOURCE_DIR, "/client/python")},
      kBuildTimeout);
  const std::string wheel = Shell("ls " + dist + "/chorus-*.whl");
  ASSERT_FALSE(wheel.empty());
  const std::string wheel_path(absl::StripTrailingAsciiWhitespace(wheel));
  EXPECT_THAT(Shell(absl::StrCat(CHORUS_PYTHON, " -m zipfile -l ", wheel_path)),
              HasSubstr("chorus/_embedded."));
  const std::string site = ScratchDir() + "/site";
  RunOk({CHORUS_PYTHON, "-m", "pip", "install", "--quiet", "--no-deps",
         "--no-index", "--target", site, wheel_path},
        kBuildTimeout);

  absl::StatusOr<Daemon> coordinator = StartCoordinator();
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  const std::string out = RunOk(
      {"/usr/bin/env", "PYTHONPATH=" + site, CHORUS_PYTHON, "-c",
       absl::StrCat("import numpy as np, chorus, chorus._embedded\n"
                    "comm = chorus.join('wheel', 1, 0, coordinator='",
                    coordinator->address,
                    "')\n"
                    "print(comm.all_reduce(np.array([1, 2, 3], np.float32))"
                    ".tolist())\n"
                    "comm.close()\n")},
      kRankTimeout);
  EXPECT_THAT(out, HasSubstr("[1.0, 2.0, 3.0]"));
}
#endif

}  // namespace
}  // namespace chorus::test
