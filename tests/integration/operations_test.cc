// Integration tests of what operators and orchestrators rely on: the
// grpc.health.v1 health service and --help of each binary.

#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/daemons.h"

namespace chorus::test {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

TEST(OperationsTest, HealthCheck_Coordinator_Serving) {
  absl::StatusOr<Daemon> coordinator = StartCoordinator();
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  absl::StatusOr<int> serving = HealthCheck(coordinator->address);
  ASSERT_TRUE(serving.ok()) << serving.status();
  EXPECT_EQ(*serving, kHealthServing);
}

TEST(OperationsTest, HealthCheck_Worker_Serving) {
  absl::StatusOr<Daemon> coordinator = StartCoordinator();
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  absl::StatusOr<Daemon> worker =
      StartWorker(coordinator->address, {"--name=worker-a", "--devices=cpu"});
  ASSERT_TRUE(worker.ok()) << worker.status();
  absl::StatusOr<int> serving = HealthCheck(worker->address);
  ASSERT_TRUE(serving.ok()) << serving.status();
  EXPECT_EQ(*serving, kHealthServing);
}

TEST(OperationsTest, HealthCheck_ServiceNames_ServingAndUnknownNotFound) {
  absl::StatusOr<Daemon> coordinator = StartCoordinator();
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  absl::StatusOr<Daemon> worker =
      StartWorker(coordinator->address, {"--name=worker-a", "--devices=cpu"});
  ASSERT_TRUE(worker.ok()) << worker.status();
  const std::vector<std::pair<std::string, std::string>> served = {
      {coordinator->address, "chorus.v1.Coordinator"},
      {worker->address, "chorus.v1.WorkerLocal"},
      {worker->address, "chorus.v1.Peer"},
  };
  for (const auto& [address, service] : served) {
    absl::StatusOr<int> serving = HealthCheck(address, service);
    ASSERT_TRUE(serving.ok()) << service << ": " << serving.status();
    EXPECT_EQ(*serving, kHealthServing) << service;
  }
  absl::StatusOr<int> unknown =
      HealthCheck(coordinator->address, "chorus.v1.NoSuchService");
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound)
      << unknown.status();
}

// Debian's Abseil (20220623) prints the usage to stdout and exits with 1 on
// --help; these tests pin that behaviour.
constexpr int kHelpExitCode = 1;

TEST(OperationsTest, Help_Coordinator_PrintsUsageAndExitsOne) {
  absl::StatusOr<CommandResult> result =
      RunCommand(CoordinatorBinary(), {"--help"});
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->exit_code, kHelpExitCode) << result->err;
  EXPECT_THAT(
      result->out,
      AllOf(HasSubstr("Usage: chorus-coordinator"), HasSubstr("--listen"),
            HasSubstr("--lease_timeout"), HasSubstr("--port_file")));
}

TEST(OperationsTest, Help_Worker_PrintsUsageAndExitsOne) {
  absl::StatusOr<CommandResult> result = RunCommand(WorkerBinary(), {"--help"});
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->exit_code, kHelpExitCode) << result->err;
  EXPECT_THAT(result->out,
              AllOf(HasSubstr("Usage: chorus-worker"),
                    HasSubstr("--coordinator"), HasSubstr("--devices"),
                    HasSubstr("--listen"), HasSubstr("--port_file")));
}

TEST(OperationsTest, Help_Chorusctl_PrintsUsageAndExitsOne) {
  absl::StatusOr<CommandResult> result = RunChorusctl({"--help"});
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->exit_code, kHelpExitCode) << result->err;
  EXPECT_THAT(result->out,
              AllOf(HasSubstr("Usage: chorusctl"), HasSubstr("--coordinator"),
                    HasSubstr("--timeout"), HasSubstr("workers")));
}

}  // namespace
}  // namespace chorus::test
