#include "server/coordinator/lease_sweeper.h"

#include <string>

#include "gtest/gtest.h"
#include "tests/testing/fake_clock.h"

namespace chorus {
namespace {

TEST(LeaseSweeper, StartStop_NoWorkers_StopsPromptly) {
  FakeClock clock;
  Registry registry(&clock, absl::Hours(1));
  LeaseSweeper sweeper(&registry, [](const WorkerRecord&) {});
  sweeper.Start();
  sweeper.Stop();  // must not wait out the hour-long lease
  sweeper.Stop();  // idempotent
}

TEST(LeaseSweeper, ExpiredWorker_ReportedOnce) {
  FakeClock clock;
  Registry registry(&clock, absl::Seconds(5));
  WorkerRegistration r;
  r.name = "w1";
  r.address = "a:1";
  Device cpu;
  cpu.kind = DeviceKind::kCpu;
  r.devices = {cpu};
  ASSERT_TRUE(registry.Register(r).ok());
  // The fake clock is already past the lease, so the sweeper evicts on its
  // first pass.
  clock.Advance(absl::Seconds(6));
  absl::Mutex mu;
  std::vector<std::string> evicted;
  LeaseSweeper sweeper(&registry, [&](const WorkerRecord& record) {
    absl::MutexLock lock(&mu);
    evicted.push_back(record.registration.name);
  });
  sweeper.Start();
  {
    absl::MutexLock lock(&mu);
    mu.Await(absl::Condition(
        +[](std::vector<std::string>* v) { return !v->empty(); }, &evicted));
  }
  sweeper.Stop();
  EXPECT_EQ(evicted, std::vector<std::string>{"w1"});
  EXPECT_TRUE(registry.List().empty());
}

}  // namespace
}  // namespace chorus
