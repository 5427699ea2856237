// chorus-compare-mpi: MPI_Allreduce (f32 sum) measured with chorus-bench's
// rules (measure.h), one rank per process. Start it with mpirun; which
// transport it runs over (shared memory or TCP) is mpirun's choice, and
// bench/compare passes it. Rank 0 prints the CSV rows; the plan column says
// "auto" (MPI picks its algorithm). MPI errors abort the job
// (MPI_ERRORS_ARE_FATAL).
//
// Exit status: 0 when every result was right, 1 otherwise.

#include <mpi.h>

#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/statusor.h"
#include "bench/compare_drivers/measure.h"

namespace chorus::bench::compare {
namespace {

// Collectives on MPI_COMM_WORLD.
class MpiCollectives : public Collectives {
 public:
  MpiCollectives() {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
  }

  int rank() const override { return rank_; }
  int world_size() const override { return size_; }

  void AllReduceSum(const float* in, float* out, size_t count) override {
    MPI_Allreduce(in, out, static_cast<int>(count), MPI_FLOAT, MPI_SUM,
                  MPI_COMM_WORLD);
  }

  int64_t AgreeMax(int64_t value) override {
    int64_t out = 0;
    MPI_Allreduce(&value, &out, 1, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD);
    return out;
  }
  int64_t AgreeSum(int64_t value) override {
    int64_t out = 0;
    MPI_Allreduce(&value, &out, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
    return out;
  }

  void MaxAtRoot(std::vector<int64_t>& values) override {
    std::vector<int64_t> out(values.size());
    MPI_Reduce(values.data(), out.data(), static_cast<int>(values.size()),
               MPI_INT64_T, MPI_MAX, 0, MPI_COMM_WORLD);
    if (rank_ == 0) values = std::move(out);
  }

  void Barrier() override { MPI_Barrier(MPI_COMM_WORLD); }

 private:
  int rank_ = 0;
  int size_ = 0;
};

}  // namespace
}  // namespace chorus::bench::compare

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  absl::SetProgramUsageMessage(
      "chorus-compare-mpi: MPI_Allreduce timed like chorus-bench.\n"
      "Usage: mpirun -np N chorus-compare-mpi [--sizes=8,64K,1M,64M] "
      "[--time_per_size=1s]");
  absl::ParseCommandLine(argc, argv);
  absl::StatusOr<chorus::bench::compare::Rules> rules =
      chorus::bench::compare::RulesFromFlags();
  if (!rules.ok()) {
    std::fprintf(stderr, "chorus-compare-mpi: %s\n",
                 rules.status().ToString().c_str());
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  chorus::bench::compare::MpiCollectives system;
  const uint64_t wrong =
      chorus::bench::compare::RunSizes(system, *rules, "auto");
  if (wrong > 0) {
    std::fprintf(stderr, "chorus-compare-mpi: rank %d: %llu wrong elements\n",
                 system.rank(), static_cast<unsigned long long>(wrong));
  }
  MPI_Finalize();
  return wrong > 0 ? 1 : 0;
}
