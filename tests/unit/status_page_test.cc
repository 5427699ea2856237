// The coordinator's status page and the metrics its core counts, on a fake
// clock.
#include "server/coordinator/status_page.h"

#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/metrics.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/fake_clock.h"

namespace chorus {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

class StatusPageTest : public ::testing::Test {
 protected:
  StatusPageTest() : core_(&clock_, CoordinatorOptions()) {
    for (int w = 0; w < 2; ++w) {
      WorkerRegistration r;
      r.name = absl::StrCat("host-", w);
      r.host = r.name;
      r.address = absl::StrCat(r.name, ":7001");
      r.incarnation = 1;
      Device cpu;
      cpu.kind = DeviceKind::kCpu;
      r.devices = {cpu};
      absl::StatusOr<RegisterResult> registered = core_.Register(r);
      EXPECT_TRUE(registered.ok()) << registered.status();
      ids_[w] = registered.ok() ? registered->worker_id : 0;
    }
  }

  // Forms group "job<1>" of `world` ranks, rank r on worker r % 2.
  uint64_t FormGroup(int world = 2) {
    uint64_t epoch = 0;
    for (int rank = 0; rank < world; ++rank) {
      JoinRequest join;
      join.group = "job<1>";
      join.world_size = world;
      join.rank = rank;
      join.worker_id = ids_[rank % 2];
      join.device.kind = DeviceKind::kCpu;
      join.deadline = clock_.Now() + absl::Seconds(30);
      core_.Join(std::move(join), [&epoch](absl::StatusOr<GroupView> view) {
        if (view.ok()) epoch = view->epoch;
      });
    }
    EXPECT_NE(epoch, 0u);
    return epoch;
  }

  void Barrier(uint64_t epoch, int rank, uint64_t sequence) {
    CollectiveCall call;
    call.group = "job<1>";
    call.epoch = epoch;
    call.rank = rank;
    call.sequence = sequence;
    call.spec.kind = CollectiveKind::kBarrier;
    call.deadline = clock_.Now() + absl::Seconds(60);
    core_.Collective(std::move(call), [](absl::StatusOr<CollectiveOutcome>) {});
  }

  static uint64_t Count(const std::string& name, const LabelValues& labels) {
    return DefaultMetrics().Counters(name, "", {})->With(labels)->value();
  }

  FakeClock clock_;
  Coordinator core_;
  uint64_t ids_[2] = {0, 0};
};

TEST_F(StatusPageTest, RenderStatusPage_FormedGroup_ShowsWorkersAndMembers) {
  FormGroup();
  clock_.Advance(absl::Milliseconds(1500));
  const std::string page = RenderStatusPage(core_, {});
  EXPECT_THAT(page, HasSubstr("<meta http-equiv=\"refresh\" content=\"2\">"));
  EXPECT_THAT(page, HasSubstr("<td>host-0</td><td>host-0:7001</td>"
                              "<td>Cpu</td><td>1.5s ago</td>"));
  EXPECT_THAT(page, HasSubstr("0: host-0 Cpu; 1: host-1 Cpu"));
  // Names are escaped.
  EXPECT_THAT(page, HasSubstr("<td>job&lt;1&gt;</td>"));
  EXPECT_THAT(page, Not(HasSubstr("job<1>")));
  EXPECT_THAT(page, HasSubstr("2 workers, 1 groups"));
}

TEST_F(StatusPageTest, RenderStatusPage_LargeGroup_FirstMembersShown) {
  FormGroup(70);
  const std::string page = RenderStatusPage(core_, {});
  EXPECT_THAT(page, HasSubstr("; 63: host-1 Cpu; and 6 more (chorusctl groups "
                              "lists them all)"));
  EXPECT_THAT(page, Not(HasSubstr("64: host-0 Cpu")));
}

TEST_F(StatusPageTest, RenderStatusPage_RankMissing_ShowsWhatTheGroupWaitsFor) {
  const uint64_t epoch = FormGroup();
  Barrier(epoch, 0, 1);
  clock_.Advance(absl::Seconds(4));
  EXPECT_THAT(RenderStatusPage(core_, {}),
              HasSubstr("#1 waits for rank 1 since 4s ago"));
}

TEST_F(StatusPageTest, RenderStatusPage_RankWaitsInJoin_ShowsTheMissingRank) {
  JoinRequest join;
  join.group = "late";
  join.world_size = 3;
  join.rank = 1;
  join.worker_id = ids_[1];
  join.device.kind = DeviceKind::kCpu;
  join.deadline = clock_.Now() + absl::Seconds(30);
  core_.Join(std::move(join), [](absl::StatusOr<GroupView>) {});
  clock_.Advance(absl::Seconds(2));
  const std::vector<FormingSummary> forming = core_.Forming();
  ASSERT_EQ(forming.size(), 1u);
  EXPECT_EQ(forming[0].world_size, 3);
  EXPECT_EQ(forming[0].missing_ranks, (std::vector<int>{0, 2}));
  EXPECT_THAT(RenderStatusPage(core_, {}),
              HasSubstr("<td>late</td><td>3</td><td>1: host-1</td>"
                        "<td>ranks 0, 2 since 2s ago</td>"));
}

TEST_F(StatusPageTest, RenderStatusPage_CallsEnded_ListsRecentVerdicts) {
  const uint64_t epoch = FormGroup();
  Barrier(epoch, 0, 1);
  Barrier(epoch, 1, 1);
  const std::string page = RenderStatusPage(core_, {});
  EXPECT_THAT(page, HasSubstr("<td>#1</td><td>barrier</td>"));
  EXPECT_THAT(page, HasSubstr("<td>OK</td>"));
}

TEST_F(StatusPageTest, RenderStatusPage_WorkerLost_GroupShownAborted) {
  const uint64_t epoch = FormGroup();
  Barrier(epoch, 0, 1);
  ASSERT_TRUE(core_.Deregister(ids_[1], 1).ok());
  const std::string page = RenderStatusPage(core_, {});
  EXPECT_THAT(page, HasSubstr("aborted: group job&lt;1&gt;"));
  EXPECT_THAT(page, HasSubstr("ABORTED: group job&lt;1&gt;"));
}

TEST_F(StatusPageTest, Collective_CallEnds_CountedOnceByKindPlanAndCode) {
  const LabelValues ok = {"barrier", "inline", "OK"};
  const uint64_t before = Count("chorus_collectives_total", ok);
  const uint64_t epoch = FormGroup();
  Barrier(epoch, 0, 1);
  EXPECT_EQ(Count("chorus_collectives_total", ok), before);
  Barrier(epoch, 1, 1);
  EXPECT_EQ(Count("chorus_collectives_total", ok), before + 1);
}

TEST_F(StatusPageTest, Deregister_GroupAborted_CountedAsWorkerLost) {
  const uint64_t aborts = Count("chorus_aborts_total", {"worker_lost"});
  const uint64_t lost = Count("chorus_workers_lost_total", {"deregistered"});
  const LabelValues aborted = {"barrier", "auto", "ABORTED"};
  const uint64_t calls = Count("chorus_collectives_total", aborted);
  const uint64_t epoch = FormGroup();
  Barrier(epoch, 0, 1);
  ASSERT_TRUE(core_.Deregister(ids_[1], 1).ok());
  EXPECT_EQ(Count("chorus_aborts_total", {"worker_lost"}), aborts + 1);
  EXPECT_EQ(Count("chorus_workers_lost_total", {"deregistered"}), lost + 1);
  EXPECT_EQ(Count("chorus_collectives_total", aborted), calls + 1);
}

}  // namespace
}  // namespace chorus
