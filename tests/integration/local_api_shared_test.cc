// Collectives on shared memory through a real worker daemon's local API
// (OpenSharedRegion, shared_input/shared_output), from a C++ client that
// maps the daemon's regions as any client on its host does: in-place
// all_reduce of two ranks under the same_host plan (written into the
// region directly) and the ring (through the daemon's buffer), and a region
// released while a call on it waits for its peer, which the call still
// writes once the peer comes.
#include <fcntl.h>
#include <grpcpp/client_context.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "chorus/v1/worker.grpc.pb.h"
#include "common/grpc_status.h"
#include "common/net.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/daemons.h"
#include "tests/testing/local_calls.h"
#include "tests/testing/wait.h"

namespace chorus::test {
namespace {

constexpr absl::Duration kCallTimeout = absl::Seconds(60);
constexpr uint64_t kCount = 1 << 16;  // u32 elements per rank
constexpr uint64_t kBytes = kCount * sizeof(uint32_t);

// A region of the daemon mapped into this process.
class Mapped {
 public:
  static absl::StatusOr<std::unique_ptr<Mapped>> Open(
      const v1::SharedRegion& region) {
    const std::string path =
        absl::StrCat("/proc/", region.pid(), "/fd/", region.fd());
    const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0) return absl::InternalError(absl::StrCat("cannot open ", path));
    char link[256];
    const std::string self = absl::StrCat("/proc/self/fd/", fd);
    const ssize_t n = readlink(self.c_str(), link, sizeof(link) - 1);
    const std::string want =
        absl::StrCat("/memfd:", region.name(), " (deleted)");
    if (n < 0 || std::string(link, n) != want) {
      close(fd);
      return absl::InternalError(absl::StrCat(path, " is not ", want));
    }
    void* data = mmap(nullptr, region.bytes(), PROT_READ | PROT_WRITE,
                      MAP_SHARED, fd, 0);
    close(fd);
    if (data == MAP_FAILED) return absl::InternalError("mmap failed");
    return std::unique_ptr<Mapped>(
        new Mapped(static_cast<uint32_t*>(data), region.bytes()));
  }
  ~Mapped() { munmap(data_, bytes_); }

  uint32_t* data() const { return data_; }

 private:
  Mapped(uint32_t* data, uint64_t bytes) : data_(data), bytes_(bytes) {}
  uint32_t* const data_;
  const uint64_t bytes_;
};

class LocalApiSharedTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<Daemon> coordinator = StartCoordinator();
    ASSERT_TRUE(coordinator.ok()) << coordinator.status();
    coordinator_ = *std::move(coordinator);
    absl::StatusOr<Daemon> worker =
        StartWorker(coordinator_.address, {"--name=shared-w"});
    ASSERT_TRUE(worker.ok()) << worker.status();
    worker_ = *std::move(worker);
    stub_ =
        v1::WorkerLocal::NewStub(MakeChannel(worker_.address, Role::kWorker));
  }

  // Joins ranks 0 and 1 of `group` through the worker; returns the epoch.
  uint64_t JoinTwo(const std::string& group) {
    std::vector<uint64_t> epochs(2);
    std::vector<std::thread> threads;
    for (int r = 0; r < 2; ++r) {
      threads.emplace_back([&, r] {
        grpc::ClientContext context;
        context.set_deadline(DeadlineAfter(kCallTimeout));
        v1::LocalJoinRequest request;
        request.set_group(group);
        request.set_world_size(2);
        request.set_rank(r);
        v1::LocalJoinResponse response;
        EXPECT_TRUE(stub_->JoinGroup(&context, request, &response).ok());
        epochs[r] = response.epoch();
      });
    }
    for (std::thread& t : threads) t.join();
    return epochs[0];
  }

  absl::StatusOr<v1::SharedRegion> OpenRegion(const std::string& group,
                                              uint64_t epoch, int rank) {
    grpc::ClientContext context;
    context.set_deadline(DeadlineAfter(kCallTimeout));
    v1::SharedRegionRequest request;
    request.set_group(group);
    request.set_epoch(epoch);
    request.set_rank(rank);
    request.set_bytes(kBytes);
    v1::SharedRegion region;
    absl::Status status =
        FromGrpcStatus(stub_->OpenSharedRegion(&context, request, &region));
    if (!status.ok()) return status;
    return region;
  }

  // Rank `rank`'s all_reduce (sum) of kCount u32 in place in `region`.
  absl::Status AllReduceInPlace(const std::string& group, uint64_t epoch,
                                int rank, uint64_t sequence,
                                v1::Algorithm algorithm,
                                const v1::SharedRegion& region) {
    v1::LocalCollectiveRequest call =
        OneU32AllReduce(group, epoch, rank, sequence);
    call.clear_data();
    call.mutable_spec()->set_count(kCount);
    call.set_algorithm(algorithm);
    for (v1::SharedBuffer* buffer :
         {call.mutable_shared_input(), call.mutable_shared_output()}) {
      buffer->set_region(region.region());
      buffer->set_offset(0);
      buffer->set_bytes(kBytes);
    }
    grpc::ClientContext context;
    context.set_deadline(DeadlineAfter(kCallTimeout));
    v1::LocalCollectiveResponse response;
    absl::Status status =
        FromGrpcStatus(stub_->Collective(&context, call, &response));
    if (status.ok() && !response.data().empty()) {
      return absl::InternalError("the output came in the reply");
    }
    return status;
  }

  // Opens a region for each of ranks 0 and 1 of `group` and maps it into
  // regions_ and mapped_.
  void OpenAndMapTwo(const std::string& group, uint64_t epoch) {
    for (int r = 0; r < 2; ++r) {
      absl::StatusOr<v1::SharedRegion> region = OpenRegion(group, epoch, r);
      ASSERT_TRUE(region.ok()) << region.status();
      absl::StatusOr<std::unique_ptr<Mapped>> map = Mapped::Open(*region);
      ASSERT_TRUE(map.ok()) << map.status();
      regions_.push_back(*region);
      mapped_.push_back(*std::move(map));
    }
  }

  Daemon coordinator_;
  Daemon worker_;
  std::unique_ptr<v1::WorkerLocal::Stub> stub_;
  std::vector<v1::SharedRegion> regions_;
  std::vector<std::unique_ptr<Mapped>> mapped_;
};

TEST_F(LocalApiSharedTest,
       Collective_InPlaceOnTwoRanks_ResultInEachRegionUnderEveryPlan) {
  const uint64_t epoch = JoinTwo("inplace");
  ASSERT_NE(epoch, 0u);
  ASSERT_NO_FATAL_FAILURE(OpenAndMapTwo("inplace", epoch));
  uint64_t sequence = 0;
  for (v1::Algorithm algorithm :
       {v1::ALGORITHM_SAME_HOST, v1::ALGORITHM_RING}) {
    ++sequence;
    for (int r = 0; r < 2; ++r) {
      for (uint64_t i = 0; i < kCount; ++i) {
        mapped_[r]->data()[i] = static_cast<uint32_t>(i * (r + 1));
      }
    }
    std::vector<absl::Status> ran(2);
    std::vector<std::thread> ranks;
    for (int r = 0; r < 2; ++r) {
      ranks.emplace_back([&, r] {
        ran[r] = AllReduceInPlace("inplace", epoch, r, sequence, algorithm,
                                  regions_[r]);
      });
    }
    for (std::thread& t : ranks) t.join();
    for (int r = 0; r < 2; ++r) {
      ASSERT_TRUE(ran[r].ok()) << algorithm << " rank " << r << ": " << ran[r];
      for (uint64_t i : {uint64_t{0}, uint64_t{1}, kCount / 2, kCount - 1}) {
        EXPECT_EQ(mapped_[r]->data()[i], static_cast<uint32_t>(3 * i))
            << algorithm << " rank " << r << " element " << i;
      }
    }
  }
}

TEST_F(LocalApiSharedTest,
       ReleaseSharedRegion_WhileACallOnItWaits_CallStillWritesIt) {
  const uint64_t epoch = JoinTwo("release");
  ASSERT_NE(epoch, 0u);
  ASSERT_NO_FATAL_FAILURE(OpenAndMapTwo("release", epoch));
  for (const std::unique_ptr<Mapped>& map : mapped_) {
    std::fill(map->data(), map->data() + kCount, 1u);
  }
  absl::Status first;
  std::thread waiting([&] {
    first = AllReduceInPlace("release", epoch, 0, 1, v1::ALGORITHM_RING,
                             regions_[0]);
  });
  // Once the coordinator holds rank 0's call, the daemon runs it with the
  // region it took; the region is released, then rank 1 comes.
  std::unique_ptr<v1::Coordinator::Stub> coordinator =
      NewCoordinatorStub(coordinator_.address);
  ASSERT_TRUE(
      WaitUntil([&] { return PendingSequence(*coordinator, "release") == 1; },
                kCallTimeout));
  grpc::ClientContext context;
  context.set_deadline(DeadlineAfter(kCallTimeout));
  v1::SharedRegionRelease release;
  release.set_group("release");
  release.set_epoch(epoch);
  release.set_rank(0);
  release.set_region(regions_[0].region());
  v1::SharedRegionReleased released;
  ASSERT_TRUE(stub_->ReleaseSharedRegion(&context, release, &released).ok());
  const absl::Status second =
      AllReduceInPlace("release", epoch, 1, 1, v1::ALGORITHM_RING, regions_[1]);
  waiting.join();
  ASSERT_TRUE(first.ok()) << first;
  ASSERT_TRUE(second.ok()) << second;
  EXPECT_EQ(mapped_[0]->data()[0], 2u);
  EXPECT_EQ(mapped_[0]->data()[kCount - 1], 2u);
  EXPECT_EQ(mapped_[1]->data()[kCount - 1], 2u);
}

}  // namespace
}  // namespace chorus::test
