// Integration tests of worker registration: real chorus-coordinator and
// chorus-worker processes on 127.0.0.1, the chorusctl CLI, and direct
// RegisterWorker calls through the gRPC stub.

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "chorus/v1/coordinator.grpc.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/daemons.h"

namespace chorus::test {
namespace {

using ::testing::AllOf;
using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::EndsWith;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::StartsWith;

// How long a worker that refuses its devices may take to exit.
constexpr absl::Duration kExitTimeout = absl::Seconds(30);

constexpr char kRefusalPrefix[] =
    "Distributed operations are not supported for device ";

// One line per worker with everything the registry holds about it except
// the lease age, which changes between two calls.
std::vector<std::string> Snapshot(const std::vector<v1::WorkerInfo>& workers) {
  std::vector<std::string> lines;
  for (const v1::WorkerInfo& w : workers) {
    std::vector<std::string> devices;
    for (const v1::Device& d : w.devices()) devices.push_back(d.DebugString());
    lines.push_back(absl::StrCat(w.worker_id(), " ", w.name(), " ", w.host(),
                                 " ", w.address(), " ", w.incarnation(), " ",
                                 w.cuda_support(), " [",
                                 absl::StrJoin(devices, "|"), "]"));
  }
  return lines;
}

std::vector<std::string> Lines(const std::string& text) {
  return absl::StrSplit(text, '\n', absl::SkipEmpty());
}

v1::Device MakeDevice(v1::DeviceKind kind, int index,
                      const std::string& other_kind = "") {
  v1::Device device;
  device.set_kind(kind);
  device.set_index(index);
  device.set_other_kind(other_kind);
  return device;
}

v1::Device CpuDevice() { return MakeDevice(v1::DEVICE_KIND_CPU, 0); }

v1::RegisterWorkerRequest MakeRequest(const std::string& name,
                                      uint64_t incarnation,
                                      const std::vector<v1::Device>& devices) {
  v1::RegisterWorkerRequest request;
  request.set_name(name);
  request.set_host("test-host");
  // Nobody serves here; the coordinator only records the address.
  request.set_address("127.0.0.1:1");
  request.set_incarnation(incarnation);
  for (const v1::Device& device : devices) *request.add_devices() = device;
  return request;
}

// A coordinator whose leases outlast the test, so entries registered by hand
// (which send no heartbeats) stay put.
absl::StatusOr<Daemon> StartLongLeaseCoordinator() {
  return StartCoordinator({"--lease_timeout=600s"});
}

TEST(RegistrationTest, Register_TwoWorkers_BothListed) {
  absl::StatusOr<Daemon> coordinator = StartCoordinator();
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  absl::StatusOr<Daemon> a =
      StartWorker(coordinator->address, {"--name=worker-a"});
  ASSERT_TRUE(a.ok()) << a.status();
  absl::StatusOr<Daemon> b =
      StartWorker(coordinator->address, {"--name=worker-b"});
  ASSERT_TRUE(b.ok()) << b.status();

  auto stub = NewCoordinatorStub(coordinator->address);
  absl::StatusOr<std::vector<v1::WorkerInfo>> workers = ListWorkers(*stub);
  ASSERT_TRUE(workers.ok()) << workers.status();
  ASSERT_THAT(WorkerNames(*workers), ElementsAre("worker-a", "worker-b"));

  std::map<std::string, v1::WorkerInfo> by_name;
  for (const v1::WorkerInfo& w : *workers) by_name[w.name()] = w;
  const v1::WorkerInfo& info_a = by_name["worker-a"];
  const v1::WorkerInfo& info_b = by_name["worker-b"];
  EXPECT_EQ(info_a.address(), a->address);
  EXPECT_EQ(info_b.address(), b->address);
  EXPECT_NE(info_a.worker_id(), info_b.worker_id());
  EXPECT_NE(info_a.incarnation(), 0u);
  EXPECT_NE(info_b.incarnation(), 0u);
  // Discovery always finds the CPU, and lists it first.
  for (const v1::WorkerInfo* info : {&info_a, &info_b}) {
    ASSERT_FALSE(info->devices().empty()) << info->name();
    EXPECT_EQ(info->devices(0).kind(), v1::DEVICE_KIND_CPU) << info->name();
  }
}

// --advertise_address without a port gets the bound port (it used to be
// registered as given and fail at the first data-plane collective); one
// that is not an address ends the worker at once.
TEST(RegistrationTest, WorkerStart_AdvertiseHostWithoutPort_BoundPortAdded) {
  absl::StatusOr<Daemon> coordinator = StartCoordinator();
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  absl::StatusOr<Daemon> worker =
      StartWorker(coordinator->address,
                  {"--name=worker-a", "--advertise_address=127.0.0.1"});
  ASSERT_TRUE(worker.ok()) << worker.status();
  auto stub = NewCoordinatorStub(coordinator->address);
  absl::StatusOr<std::vector<v1::WorkerInfo>> workers = ListWorkers(*stub);
  ASSERT_TRUE(workers.ok()) << workers.status();
  ASSERT_EQ(workers->size(), 1u);
  EXPECT_EQ((*workers)[0].address(), worker->address);

  absl::StatusOr<std::unique_ptr<Subprocess>> bad =
      SpawnWorker(coordinator->address,
                  {"--name=worker-bad", "--advertise_address=host:99999"});
  ASSERT_TRUE(bad.ok()) << bad.status();
  absl::StatusOr<int> code = (*bad)->WaitForExit(kExitTimeout);
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_NE(*code, 0);
  EXPECT_THAT((*bad)->ReadLog(),
              HasSubstr("INVALID_ARGUMENT: advertise address \"host:99999\""));
}

// An advertised address peers could not use ends the worker at start, not
// at its first data-plane collective: here a routable address while the
// worker listens on loopback only.
TEST(RegistrationTest, WorkerStart_AdvertiseUnreachable_RefusedAtStart) {
  absl::StatusOr<Daemon> coordinator = StartCoordinator();
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  absl::StatusOr<std::unique_ptr<Subprocess>> bad = SpawnWorker(
      coordinator->address, {"--name=worker-far", "--listen=127.0.0.1:0",
                             "--advertise_address=192.0.2.1"});
  ASSERT_TRUE(bad.ok()) << bad.status();
  absl::StatusOr<int> code = (*bad)->WaitForExit(kExitTimeout);
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_NE(*code, 0);
  EXPECT_THAT((*bad)->ReadLog(),
              HasSubstr("INVALID_ARGUMENT: advertise address \"192.0.2.1:"));
  auto stub = NewCoordinatorStub(coordinator->address);
  absl::StatusOr<std::vector<v1::WorkerInfo>> workers = ListWorkers(*stub);
  ASSERT_TRUE(workers.ok()) << workers.status();
  EXPECT_TRUE(workers->empty());
}

TEST(RegistrationTest, ChorusctlWorkers_TwoWorkers_PrintsNamesAddressesCpu) {
  absl::StatusOr<Daemon> coordinator = StartCoordinator();
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  absl::StatusOr<Daemon> a =
      StartWorker(coordinator->address, {"--name=worker-a"});
  ASSERT_TRUE(a.ok()) << a.status();
  absl::StatusOr<Daemon> b =
      StartWorker(coordinator->address, {"--name=worker-b"});
  ASSERT_TRUE(b.ok()) << b.status();

  absl::StatusOr<CommandResult> result = RunChorusctl(
      {absl::StrCat("--coordinator=", coordinator->address), "workers"});
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->exit_code, 0) << result->err;
  const std::vector<std::string> lines = Lines(result->out);
  EXPECT_THAT(lines, Contains(AllOf(HasSubstr("worker-a"),
                                    HasSubstr(a->address), HasSubstr("Cpu"))))
      << result->out;
  EXPECT_THAT(lines, Contains(AllOf(HasSubstr("worker-b"),
                                    HasSubstr(b->address), HasSubstr("Cpu"))))
      << result->out;
  EXPECT_THAT(lines, Contains("2 workers")) << result->out;
}

TEST(RegistrationTest,
     WorkerStart_VulkanDevice_ExitsUnimplementedRegistryKept) {
  absl::StatusOr<Daemon> coordinator = StartCoordinator();
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  absl::StatusOr<Daemon> good =
      StartWorker(coordinator->address, {"--name=worker-good"});
  ASSERT_TRUE(good.ok()) << good.status();
  auto stub = NewCoordinatorStub(coordinator->address);
  absl::StatusOr<std::vector<v1::WorkerInfo>> before = ListWorkers(*stub);
  ASSERT_TRUE(before.ok()) << before.status();

  absl::StatusOr<std::unique_ptr<Subprocess>> refused = SpawnWorker(
      coordinator->address, {"--name=worker-vulkan", "--devices=cpu,vulkan:0"});
  ASSERT_TRUE(refused.ok()) << refused.status();
  absl::StatusOr<int> code = (*refused)->WaitForExit(kExitTimeout);
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_NE(*code, 0);
  // The status is printed as is: nothing follows the device name.
  const std::string log = (*refused)->ReadLog();
  EXPECT_THAT(Lines(log),
              Contains(EndsWith("UNIMPLEMENTED: Distributed operations are not "
                                "supported for device Vulkan(0)")))
      << log;

  absl::StatusOr<std::vector<v1::WorkerInfo>> after = ListWorkers(*stub);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(Snapshot(*after), Snapshot(*before));
  EXPECT_THAT(WorkerNames(*after), ElementsAre("worker-good"));
}

TEST(RegistrationTest, WorkerStart_CudaDeviceWithoutGpu_ExitsUnimplemented) {
  if (std::filesystem::exists("/dev/nvidia0")) {
    GTEST_SKIP() << "this machine has a GPU, so Cuda(0) may be served";
  }
  absl::StatusOr<Daemon> coordinator = StartCoordinator();
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  auto stub = NewCoordinatorStub(coordinator->address);

  absl::StatusOr<std::unique_ptr<Subprocess>> refused = SpawnWorker(
      coordinator->address, {"--name=worker-cuda", "--devices=cpu,cuda:0"});
  ASSERT_TRUE(refused.ok()) << refused.status();
  absl::StatusOr<int> code = (*refused)->WaitForExit(kExitTimeout);
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_NE(*code, 0);
  // More context (built without CUDA, no GPU) may follow the device name.
  const std::string log = (*refused)->ReadLog();
  EXPECT_THAT(log, HasSubstr("UNIMPLEMENTED: Distributed operations are not "
                             "supported for device Cuda(0)"))
      << log;

  absl::StatusOr<std::vector<v1::WorkerInfo>> after = ListWorkers(*stub);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_THAT(*after, IsEmpty());
}

TEST(RegistrationTest, RegisterWorker_VulkanDevice_UnimplementedRegistryKept) {
  absl::StatusOr<Daemon> coordinator = StartLongLeaseCoordinator();
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  auto stub = NewCoordinatorStub(coordinator->address);
  absl::StatusOr<v1::RegisterWorkerResponse> existing =
      RegisterWorker(*stub, MakeRequest("rpc-cpu", 11, {CpuDevice()}));
  ASSERT_TRUE(existing.ok()) << existing.status();
  absl::StatusOr<std::vector<v1::WorkerInfo>> before = ListWorkers(*stub);
  ASSERT_TRUE(before.ok()) << before.status();

  absl::StatusOr<v1::RegisterWorkerResponse> refused = RegisterWorker(
      *stub, MakeRequest("rpc-vulkan", 12,
                         {CpuDevice(), MakeDevice(v1::DEVICE_KIND_VULKAN, 0)}));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnimplemented)
      << refused.status();
  EXPECT_THAT(std::string(refused.status().message()),
              StartsWith(absl::StrCat(kRefusalPrefix, "Vulkan(0)")));

  absl::StatusOr<std::vector<v1::WorkerInfo>> after = ListWorkers(*stub);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(Snapshot(*after), Snapshot(*before));
}

TEST(RegistrationTest, RegisterWorker_OtherKindNpu_UnimplementedNamesNpu2) {
  absl::StatusOr<Daemon> coordinator = StartLongLeaseCoordinator();
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  auto stub = NewCoordinatorStub(coordinator->address);
  absl::StatusOr<v1::RegisterWorkerResponse> existing =
      RegisterWorker(*stub, MakeRequest("rpc-cpu", 21, {CpuDevice()}));
  ASSERT_TRUE(existing.ok()) << existing.status();
  absl::StatusOr<std::vector<v1::WorkerInfo>> before = ListWorkers(*stub);
  ASSERT_TRUE(before.ok()) << before.status();

  absl::StatusOr<v1::RegisterWorkerResponse> refused = RegisterWorker(
      *stub,
      MakeRequest("rpc-npu", 22,
                  {CpuDevice(), MakeDevice(v1::DEVICE_KIND_OTHER, 2, "Npu")}));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnimplemented)
      << refused.status();
  EXPECT_THAT(std::string(refused.status().message()),
              StartsWith(absl::StrCat(kRefusalPrefix, "Npu(2)")));

  absl::StatusOr<std::vector<v1::WorkerInfo>> after = ListWorkers(*stub);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(Snapshot(*after), Snapshot(*before));
}

TEST(RegistrationTest, RegisterWorker_SameNameSameIncarnation_SameWorkerId) {
  absl::StatusOr<Daemon> coordinator = StartLongLeaseCoordinator();
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  auto stub = NewCoordinatorStub(coordinator->address);
  const v1::RegisterWorkerRequest request =
      MakeRequest("rpc-retried", 31, {CpuDevice()});

  absl::StatusOr<v1::RegisterWorkerResponse> first =
      RegisterWorker(*stub, request);
  ASSERT_TRUE(first.ok()) << first.status();
  absl::StatusOr<v1::RegisterWorkerResponse> second =
      RegisterWorker(*stub, request);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_NE(first->worker_id(), 0u);
  EXPECT_EQ(second->worker_id(), first->worker_id());

  absl::StatusOr<std::vector<v1::WorkerInfo>> workers = ListWorkers(*stub);
  ASSERT_TRUE(workers.ok()) << workers.status();
  ASSERT_EQ(workers->size(), 1u);
  EXPECT_EQ((*workers)[0].worker_id(), first->worker_id());
  EXPECT_EQ((*workers)[0].incarnation(), 31u);
}

TEST(RegistrationTest, RegisterWorker_SameNameNewIncarnation_ReplacesEntry) {
  absl::StatusOr<Daemon> coordinator = StartLongLeaseCoordinator();
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  auto stub = NewCoordinatorStub(coordinator->address);

  absl::StatusOr<v1::RegisterWorkerResponse> old_entry =
      RegisterWorker(*stub, MakeRequest("rpc-restarted", 41, {CpuDevice()}));
  ASSERT_TRUE(old_entry.ok()) << old_entry.status();
  absl::StatusOr<v1::RegisterWorkerResponse> new_entry =
      RegisterWorker(*stub, MakeRequest("rpc-restarted", 42, {CpuDevice()}));
  ASSERT_TRUE(new_entry.ok()) << new_entry.status();

  absl::StatusOr<std::vector<v1::WorkerInfo>> workers = ListWorkers(*stub);
  ASSERT_TRUE(workers.ok()) << workers.status();
  ASSERT_EQ(workers->size(), 1u) << absl::StrJoin(Snapshot(*workers), "\n");
  EXPECT_EQ((*workers)[0].name(), "rpc-restarted");
  EXPECT_EQ((*workers)[0].incarnation(), 42u);
  EXPECT_EQ((*workers)[0].worker_id(), new_entry->worker_id());
}

}  // namespace
}  // namespace chorus::test
