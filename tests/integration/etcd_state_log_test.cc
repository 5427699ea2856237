// EtcdStateLog against a real etcd on 127.0.0.1: what a leader writes is
// what the next one reads, and a write whose fence no longer holds (another
// coordinator leads) writes nothing and gives the leadership up.
#include "server/coordinator/election/etcd_state_log.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_detail.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/coordinator/election/etcd_client.h"
#include "tests/testing/etcd.h"

namespace chorus::test {
namespace {

using ::testing::HasSubstr;

constexpr char kPrefix[] = "/state";
constexpr char kLeaderKey[] = "/state/leader";

WorkerRecord Worker(uint64_t id, const std::string& name) {
  WorkerRecord record;
  record.id = id;
  record.registration.name = name;
  record.registration.job = "blue";
  record.registration.address = "10.0.0.1:7100";
  record.registration.data_port = 7200;
  record.registration.incarnation = 42;
  record.registration.machine = "m1";
  Device cpu;
  cpu.kind = DeviceKind::kCpu;
  record.registration.devices = {cpu};
  return record;
}

class EtcdStateLogTest : public EtcdTest {
 protected:
  void SetUp() override {
    EtcdTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    EtcdOptions options;
    options.endpoints = {etcd_.endpoint};
    absl::StatusOr<std::unique_ptr<EtcdClient>> client =
        EtcdClient::Create(options);
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = *std::move(client);
    // This test's "leader" holds the leader key.
    absl::StatusOr<EtcdCreate> created =
        client_->CreateIfAbsent(kLeaderKey, "me", 0);
    ASSERT_TRUE(created.ok() && created->created) << created.status();
    fence_ = created->current.create_revision;
    log_ = std::make_unique<EtcdStateLog>(
        client_.get(), kPrefix, kLeaderKey, 1,
        [this](const absl::Status& why) { lost_.push_back(why); });
    log_->SetFence(fence_);
  }

  std::unique_ptr<EtcdClient> client_;
  std::unique_ptr<EtcdStateLog> log_;
  int64_t fence_ = 0;
  std::vector<absl::Status> lost_;
};

TEST_F(EtcdStateLogTest, Load_AfterWrites_ReturnsWhatTheLeaderWrote) {
  log_->SaveWorker(Worker(3, "w0"));
  log_->SaveWorker(Worker(4, "w1"));
  log_->DropWorker(4);
  StoredGroup group;
  group.job = "blue";
  group.view.name = "train";
  group.view.epoch = 77;
  group.view.min_world_size = 1;
  group.view.max_world_size = 4;
  GroupMember member;
  member.worker_id = 3;
  member.worker_name = "w0";
  member.machine = "m1";
  member.address = "10.0.0.1:7100";
  member.incarnation = 42;
  group.view.members = {member};
  group.request_ids = {"join-7"};
  group.aborted = WithErrorDetail(absl::AbortedError("rank 0 is gone"),
                                  MakeErrorDetail("RANK_GONE", "train", 77, 0));
  log_->SaveGroup(group);
  log_->SaveKey(StoredKey{"blue", "rank/0", "10.0.0.1:29500"});
  log_->SaveKey(StoredKey{"", "a/b", "x"});
  log_->DropKey("", "a/b");
  EXPECT_EQ(log_->Writes(), 7);

  absl::StatusOr<StoredState> loaded = log_->Load();
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_EQ(loaded->workers.size(), 1u);
  const WorkerRecord& worker = loaded->workers[0];
  EXPECT_EQ(worker.id, 3u);
  EXPECT_EQ(worker.registration.job, "blue");
  EXPECT_EQ(worker.registration.name, "w0");
  EXPECT_EQ(worker.registration.incarnation, 42u);
  EXPECT_EQ(worker.registration.data_port, 7200u);
  EXPECT_EQ(worker.registration.machine, "m1");
  ASSERT_EQ(worker.registration.devices.size(), 1u);
  ASSERT_EQ(loaded->groups.size(), 1u);
  const StoredGroup& read = loaded->groups[0];
  EXPECT_EQ(read.job, "blue");
  EXPECT_EQ(read.view.name, "train");
  EXPECT_EQ(read.view.epoch, 77u);
  EXPECT_EQ(read.view.world_size, 1);
  EXPECT_EQ(read.view.max_world_size, 4);
  ASSERT_EQ(read.view.members.size(), 1u);
  EXPECT_EQ(read.view.members[0].machine, "m1");
  EXPECT_EQ(read.request_ids, std::vector<std::string>{"join-7"});
  EXPECT_EQ(read.aborted, group.aborted);
  EXPECT_EQ(ErrorDetailOf(read.aborted)->reason(), "RANK_GONE");
  ASSERT_EQ(loaded->keys.size(), 1u);
  EXPECT_EQ(loaded->keys[0].job, "blue");
  EXPECT_EQ(loaded->keys[0].key, "rank/0");
  EXPECT_EQ(loaded->keys[0].value, "10.0.0.1:29500");
  EXPECT_TRUE(lost_.empty());
}

TEST_F(EtcdStateLogTest, Write_FenceGone_WritesNothingAndGivesUp) {
  // Another coordinator leads now: the key was deleted and created again.
  ASSERT_TRUE(client_
                  ->FencedWrite(kLeaderKey, fence_,
                                {EtcdWrite{kLeaderKey, std::nullopt}})
                  .ok());
  ASSERT_TRUE(client_->CreateIfAbsent(kLeaderKey, "other", 0).ok());
  log_->SaveWorker(Worker(5, "w5"));
  ASSERT_EQ(lost_.size(), 1u);
  EXPECT_EQ(lost_[0].code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(lost_[0].message(), HasSubstr("another coordinator leads"));
  absl::StatusOr<StoredState> loaded = log_->Load();
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_TRUE(loaded->workers.empty());
  EXPECT_EQ(log_->Writes(), 0);
}

TEST_F(EtcdStateLogTest, Load_ValueNotChorusState_DataLoss) {
  ASSERT_TRUE(client_
                  ->FencedWrite(kLeaderKey, fence_,
                                {EtcdWrite{"/state/workers/1", "\xff\xff"}})
                  .ok());
  absl::StatusOr<StoredState> loaded = log_->Load();
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(loaded.status().message(), HasSubstr("/state/workers/1"));
}

}  // namespace
}  // namespace chorus::test
