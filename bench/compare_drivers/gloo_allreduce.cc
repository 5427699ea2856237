// chorus-compare-gloo: one rank of Gloo's ring all-reduce (gloo::allreduce
// with the RING algorithm) over Gloo's TCP transport on 127.0.0.1, measured
// with chorus-bench's rules (measure.h). bench/compare starts one process per
// rank; they meet through a gloo FileStore in --store_dir, which must be
// empty and private to one run. Rank 0 prints the CSV rows.
//
// Exit status: 0 when every result was right, 1 otherwise or on any error.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "bench/compare_drivers/measure.h"
#include "gloo/allreduce.h"
#include "gloo/barrier.h"
#include "gloo/math.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/file_store.h"
#include "gloo/transport/tcp/device.h"

ABSL_FLAG(int32_t, rank, -1, "This process's rank.");
ABSL_FLAG(int32_t, ranks, 2, "Number of ranks (one process each).");
ABSL_FLAG(std::string, store_dir, "",
          "Empty folder for the gloo FileStore rendezvous of this run.");

namespace chorus::bench::compare {
namespace {

// Collectives through one connected gloo context.
class GlooCollectives : public Collectives {
 public:
  explicit GlooCollectives(std::shared_ptr<gloo::Context> context)
      : context_(std::move(context)) {}

  int rank() const override { return context_->rank; }
  int world_size() const override { return context_->size; }

  void AllReduceSum(const float* in, float* out, size_t count) override {
    gloo::AllreduceOptions opts(context_);
    opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
    // Gloo takes non-const inputs but does not write them.
    opts.setInput(const_cast<float*>(in), count);
    opts.setOutput(out, count);
    opts.setReduceFunction(
        static_cast<void (*)(void*, const void*, const void*, size_t)>(
            &gloo::sum<float>));
    gloo::allreduce(opts);
  }

  int64_t AgreeMax(int64_t value) override {
    return Reduce(value, &gloo::max<int64_t>);
  }
  int64_t AgreeSum(int64_t value) override {
    return Reduce(value, &gloo::sum<int64_t>);
  }

  void MaxAtRoot(std::vector<int64_t>& values) override {
    if (values.empty()) return;
    gloo::AllreduceOptions opts(context_);
    opts.setOutput(values.data(), values.size());
    opts.setReduceFunction(
        static_cast<void (*)(void*, const void*, const void*, size_t)>(
            &gloo::max<int64_t>));
    gloo::allreduce(opts);
  }

  void Barrier() override {
    gloo::BarrierOptions opts(context_);
    gloo::barrier(opts);
  }

 private:
  using ReduceFn = void (*)(void*, const void*, const void*, size_t);

  int64_t Reduce(int64_t value, ReduceFn fn) {
    gloo::AllreduceOptions opts(context_);
    opts.setOutput(&value, 1);
    opts.setReduceFunction(fn);
    gloo::allreduce(opts);
    return value;
  }

  std::shared_ptr<gloo::Context> context_;
};

int Main() {
  absl::StatusOr<Rules> rules = RulesFromFlags();
  const int rank = absl::GetFlag(FLAGS_rank);
  const int ranks = absl::GetFlag(FLAGS_ranks);
  const std::string store_dir = absl::GetFlag(FLAGS_store_dir);
  if (!rules.ok() || rank < 0 || rank >= ranks || store_dir.empty()) {
    std::fprintf(stderr, "chorus-compare-gloo: %s\n",
                 rules.ok() ? "need --rank below --ranks and --store_dir"
                            : rules.status().ToString().c_str());
    return 2;
  }
  const std::chrono::milliseconds timeout(
      absl::ToInt64Milliseconds(absl::GetFlag(FLAGS_timeout)));
  try {
    gloo::transport::tcp::attr attr("127.0.0.1");
    std::shared_ptr<gloo::transport::Device> device =
        gloo::transport::tcp::CreateDevice(attr);
    gloo::rendezvous::FileStore store(store_dir);
    auto context = std::make_shared<gloo::rendezvous::Context>(rank, ranks);
    context->setTimeout(timeout);
    context->connectFullMesh(store, device);
    GlooCollectives system(context);
    const uint64_t wrong = RunSizes(system, *rules, "ring");
    if (wrong > 0) {
      std::fprintf(stderr, "chorus-compare-gloo: rank %d: %llu wrong\n", rank,
                   static_cast<unsigned long long>(wrong));
      return 1;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "chorus-compare-gloo: rank %d: %s\n", rank, e.what());
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace chorus::bench::compare

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "chorus-compare-gloo: one rank of Gloo's ring all-reduce over TCP on "
      "127.0.0.1, timed like chorus-bench.\n"
      "Usage: chorus-compare-gloo --rank=R --ranks=N --store_dir=DIR "
      "[--sizes=8,64K,1M,64M] [--time_per_size=1s]");
  absl::ParseCommandLine(argc, argv);
  return chorus::bench::compare::Main();
}
