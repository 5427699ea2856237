#include "server/coordinator/registry.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/fake_clock.h"

namespace chorus {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;
using ::testing::StartsWith;

constexpr absl::Duration kLease = absl::Seconds(5);

Device Cpu() {
  Device d;
  d.kind = DeviceKind::kCpu;
  return d;
}

Device Dev(DeviceKind kind, int index) {
  Device d;
  d.kind = kind;
  d.index = index;
  return d;
}

WorkerRegistration Worker(std::string name, uint64_t incarnation = 1) {
  WorkerRegistration r;
  r.name = name;
  r.host = "host-a";
  r.address = name + ":7100";
  r.incarnation = incarnation;
  r.devices = {Cpu()};
  return r;
}

class RegistryTest : public ::testing::Test {
 protected:
  FakeClock clock_;
  Registry registry_{&clock_, kLease};
};

TEST_F(RegistryTest, Register_NewWorker_Listed) {
  absl::StatusOr<RegisterResult> result = registry_.Register(Worker("w1"));
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_FALSE(result->replaced);
  EXPECT_FALSE(result->retried);
  std::vector<WorkerRecord> workers = registry_.List();
  ASSERT_THAT(workers, SizeIs(1));
  EXPECT_EQ(workers[0].id, result->worker_id);
  EXPECT_EQ(workers[0].registration.name, "w1");
}

TEST_F(RegistryTest, Register_SameIncarnationAgain_SameIdNotCountedTwice) {
  uint64_t first = registry_.Register(Worker("w1", 7))->worker_id;
  absl::StatusOr<RegisterResult> again = registry_.Register(Worker("w1", 7));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->worker_id, first);
  EXPECT_TRUE(again->retried);
  EXPECT_THAT(registry_.List(), SizeIs(1));
}

TEST_F(RegistryTest, Register_NewIncarnation_ReplacesOldEntry) {
  uint64_t old_id = registry_.Register(Worker("w1", 1))->worker_id;
  absl::StatusOr<RegisterResult> fresh = registry_.Register(Worker("w1", 2));
  ASSERT_TRUE(fresh.ok());
  EXPECT_TRUE(fresh->replaced);
  EXPECT_NE(fresh->worker_id, old_id);
  std::vector<WorkerRecord> workers = registry_.List();
  ASSERT_THAT(workers, SizeIs(1));
  EXPECT_EQ(workers[0].registration.incarnation, 2u);
  EXPECT_EQ(registry_.Renew(old_id, 1).code(), absl::StatusCode::kNotFound);
}

TEST_F(RegistryTest, Renew_BeforeLease_KeepsWorker) {
  uint64_t id = registry_.Register(Worker("w1"))->worker_id;
  for (int i = 0; i < 10; ++i) {
    clock_.Advance(kLease - absl::Seconds(1));
    ASSERT_TRUE(registry_.Renew(id, 1).ok());
    EXPECT_THAT(registry_.EvictExpired(), IsEmpty());
  }
  EXPECT_THAT(registry_.List(), SizeIs(1));
}

TEST_F(RegistryTest, EvictExpired_LeaseMissed_WorkerRemoved) {
  uint64_t id = registry_.Register(Worker("w1"))->worker_id;
  ASSERT_TRUE(registry_.Register(Worker("w2")).ok());
  clock_.Advance(absl::Seconds(3));
  ASSERT_TRUE(registry_.Renew(id, 1).ok());
  clock_.Advance(kLease);  // w2 now silent for 8 s, w1 for 5 s
  EXPECT_THAT(registry_.EvictExpired(), SizeIs(1));
  std::vector<WorkerRecord> workers = registry_.List();
  ASSERT_THAT(workers, SizeIs(1));
  EXPECT_EQ(workers[0].registration.name, "w1");
}

TEST_F(RegistryTest, EvictExpired_ExactlyAtLease_NotYetEvicted) {
  ASSERT_TRUE(registry_.Register(Worker("w1")).ok());
  clock_.Advance(kLease);
  EXPECT_THAT(registry_.EvictExpired(), IsEmpty());
  clock_.Advance(absl::Milliseconds(1));
  std::vector<WorkerRecord> evicted = registry_.EvictExpired();
  ASSERT_THAT(evicted, SizeIs(1));
  EXPECT_EQ(evicted[0].registration.name, "w1");
  EXPECT_THAT(registry_.List(), IsEmpty());
}

TEST_F(RegistryTest, Renew_AfterEviction_NotFound) {
  uint64_t id = registry_.Register(Worker("w1"))->worker_id;
  clock_.Advance(kLease + absl::Seconds(1));
  registry_.EvictExpired();
  absl::Status status = registry_.Renew(id, 1);
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(status.message()), HasSubstr("register again"));
}

TEST_F(RegistryTest, Renew_WrongIncarnation_FailedPrecondition) {
  uint64_t id = registry_.Register(Worker("w1", 5))->worker_id;
  EXPECT_EQ(registry_.Renew(id, 6).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(RegistryTest, NextExpiry_TracksOldestLease) {
  EXPECT_EQ(registry_.NextExpiry(), absl::InfiniteFuture());
  const absl::Time start = clock_.Now();
  ASSERT_TRUE(registry_.Register(Worker("w1")).ok());
  clock_.Advance(absl::Seconds(2));
  ASSERT_TRUE(registry_.Register(Worker("w2")).ok());
  EXPECT_EQ(registry_.NextExpiry(), start + kLease);
}

TEST_F(RegistryTest, Deregister_Known_Removed) {
  uint64_t id = registry_.Register(Worker("w1"))->worker_id;
  ASSERT_TRUE(registry_.Deregister(id, 1).ok());
  EXPECT_THAT(registry_.List(), IsEmpty());
  EXPECT_EQ(registry_.Deregister(id, 1).status().code(),
            absl::StatusCode::kNotFound);
  // The name is free again.
  EXPECT_FALSE(registry_.Register(Worker("w1"))->retried);
}

struct BadCase {
  std::string label;
  WorkerRegistration registration;
  absl::StatusCode code;
  std::string message_start;
};

TEST_F(RegistryTest, Register_Malformed_RefusedAndNothingChanges) {
  ASSERT_TRUE(registry_.Register(Worker("existing", 3)).ok());
  const std::vector<WorkerRecord> before = registry_.List();

  std::vector<BadCase> cases;
  {
    WorkerRegistration r = Worker("");
    cases.push_back({"empty name", r, absl::StatusCode::kInvalidArgument,
                     "worker name must not be empty"});
  }
  {
    WorkerRegistration r = Worker("w");
    r.address = "";
    cases.push_back({"empty address", r, absl::StatusCode::kInvalidArgument,
                     "worker w must give the address"});
  }
  {
    WorkerRegistration r = Worker("w");
    r.devices.clear();
    cases.push_back({"no devices", r, absl::StatusCode::kInvalidArgument,
                     "worker w registers no devices"});
  }
  {
    WorkerRegistration r = Worker("w");
    r.devices = {Cpu(), Cpu()};
    cases.push_back({"duplicate devices", r, absl::StatusCode::kInvalidArgument,
                     "worker w: device Cpu is listed twice"});
  }
  {
    WorkerRegistration r = Worker("w");
    r.devices = {Dev(static_cast<DeviceKind>(99), 0)};
    cases.push_back({"unknown kind", r, absl::StatusCode::kInvalidArgument,
                     "worker w: unknown device kind 99"});
  }
  {
    WorkerRegistration r = Worker("w");
    r.devices = {Dev(DeviceKind::kUnspecified, 0)};
    cases.push_back({"unspecified kind", r, absl::StatusCode::kInvalidArgument,
                     "worker w: unknown device kind 0"});
  }
  {
    WorkerRegistration r = Worker("w");
    r.cuda_support = true;
    r.devices = {Dev(DeviceKind::kCuda, -1)};
    cases.push_back({"negative index", r, absl::StatusCode::kInvalidArgument,
                     "worker w: device index must not be negative"});
  }
  {
    WorkerRegistration r = Worker("w");
    r.devices = {Cpu(), Dev(DeviceKind::kVulkan, 0)};
    cases.push_back(
        {"vulkan", r, absl::StatusCode::kUnimplemented,
         "Distributed operations are not supported for device Vulkan(0)"});
  }
  {
    WorkerRegistration r = Worker("w");
    r.devices = {Cpu(), Dev(DeviceKind::kCuda, 0)};
    cases.push_back({"cuda without cuda support", r,
                     absl::StatusCode::kUnimplemented,
                     "Distributed operations are not supported for device "
                     "Cuda(0): this worker was built without CUDA"});
  }
  {
    // Replacing an existing worker with a refused registration must not
    // remove the existing entry.
    WorkerRegistration r = Worker("existing", 4);
    r.devices = {Dev(DeviceKind::kTpu, 3)};
    cases.push_back(
        {"refused replacement", r, absl::StatusCode::kUnimplemented,
         "Distributed operations are not supported for device Tpu(3)"});
  }

  for (const BadCase& c : cases) {
    absl::StatusOr<RegisterResult> result = registry_.Register(c.registration);
    EXPECT_EQ(result.status().code(), c.code) << c.label;
    EXPECT_THAT(std::string(result.status().message()),
                StartsWith(c.message_start))
        << c.label;
    const std::vector<WorkerRecord> after = registry_.List();
    ASSERT_EQ(after.size(), before.size()) << c.label;
    EXPECT_EQ(after[0].id, before[0].id) << c.label;
    EXPECT_EQ(after[0].registration.incarnation, 3u) << c.label;
  }
}

TEST_F(RegistryTest, Register_CudaWithSupport_Accepted) {
  WorkerRegistration r = Worker("gpu");
  r.cuda_support = true;
  r.devices = {Cpu(), Dev(DeviceKind::kCuda, 0), Dev(DeviceKind::kCuda, 1)};
  EXPECT_TRUE(registry_.Register(r).ok());
}

}  // namespace
}  // namespace chorus
