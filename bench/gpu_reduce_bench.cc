// Kernel bandwidth benchmark for the CUDA reduce engine: for every dtype and
// op, times dst = op(dst, src) over a 256 MiB buffer (3 x bytes moved: read
// dst, read src, write dst) and avg's finalize pass (2 x bytes), next to
// cudaMemcpy device-to-device in the same run (2 x bytes), and prints one
// table with GB/s and the ratio to memcpy. Run by bench/gpu_check.sh.
//
// Usage: gpu_reduce_bench [--mib=256] [--iters=20] [--device=0]
// Exits 0 with a message when no CUDA device is usable; 1 on a CUDA error.
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/status/status.h"
#include "common/dtype.h"
#include "server/reduce/cuda/cuda_reduce.h"

namespace chorus {
namespace {

struct Options {
  size_t mib = 256;
  int iters = 20;
  int device = 0;
};

bool ParseFlag(const char* arg, const char* name, long* value) {
  const size_t length = std::strlen(name);
  if (std::strncmp(arg, name, length) != 0 || arg[length] != '=') return false;
  char* end = nullptr;
  *value = std::strtol(arg + length + 1, &end, 10);
  return end != nullptr && *end == '\0' && *value >= 0;
}

bool ParseOptions(int argc, char** argv, Options* options) {
  for (int i = 1; i < argc; ++i) {
    long value = 0;
    if (ParseFlag(argv[i], "--mib", &value) && value > 0) {
      options->mib = static_cast<size_t>(value);
    } else if (ParseFlag(argv[i], "--iters", &value) && value > 0) {
      options->iters = static_cast<int>(value);
    } else if (ParseFlag(argv[i], "--device", &value)) {
      options->device = static_cast<int>(value);
    } else {
      std::fprintf(stderr, "usage: %s [--mib=256] [--iters=20] [--device=0]\n",
                   argv[0]);
      return false;
    }
  }
  return true;
}

#define BENCH_CUDA(call)                                        \
  do {                                                          \
    const cudaError_t bench_error = (call);                     \
    if (bench_error != cudaSuccess) {                           \
      std::fprintf(stderr, "gpu_reduce_bench: %s: %s\n", #call, \
                   cudaGetErrorString(bench_error));            \
      std::exit(1);                                             \
    }                                                           \
  } while (false)

void Check(const absl::Status& status) {
  if (!status.ok()) {
    std::fprintf(stderr, "gpu_reduce_bench: %s\n", status.ToString().c_str());
    std::exit(1);
  }
}

// Returns the mean milliseconds of `iters` runs of `body` on `stream`, after
// two warm-up runs.
template <typename Body>
double TimeMs(cudaStream_t stream, int iters, Body body) {
  for (int i = 0; i < 2; ++i) body();
  cudaEvent_t start, stop;
  BENCH_CUDA(cudaEventCreate(&start));
  BENCH_CUDA(cudaEventCreate(&stop));
  BENCH_CUDA(cudaEventRecord(start, stream));
  for (int i = 0; i < iters; ++i) body();
  BENCH_CUDA(cudaEventRecord(stop, stream));
  BENCH_CUDA(cudaEventSynchronize(stop));
  float ms = 0;
  BENCH_CUDA(cudaEventElapsedTime(&ms, start, stop));
  BENCH_CUDA(cudaEventDestroy(start));
  BENCH_CUDA(cudaEventDestroy(stop));
  return static_cast<double>(ms) / iters;
}

double GBps(double bytes, double ms) { return bytes / (ms * 1e-3) / 1e9; }

int Run(const Options& options) {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess || count == 0) {
    std::printf(
        "gpu_reduce_bench: no usable CUDA device (%s); nothing to "
        "measure\n",
        error != cudaSuccess ? cudaGetErrorString(error)
                             : "cudaGetDeviceCount found 0");
    return 0;
  }
  if (options.device >= count) {
    std::fprintf(stderr, "gpu_reduce_bench: no device %d (%d present)\n",
                 options.device, count);
    return 1;
  }
  BENCH_CUDA(cudaSetDevice(options.device));
  cudaDeviceProp props;
  BENCH_CUDA(cudaGetDeviceProperties(&props, options.device));
  cudaStream_t stream;
  BENCH_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  const size_t bytes = options.mib << 20;
  void* dst = nullptr;
  void* src = nullptr;
  BENCH_CUDA(cudaMalloc(&dst, bytes));
  BENCH_CUDA(cudaMalloc(&src, bytes));
  // 0x3c bytes are small finite values in every float type, so no op
  // overflows into infinities or NaN within a run.
  BENCH_CUDA(cudaMemset(dst, 0x3c, bytes));
  BENCH_CUDA(cudaMemset(src, 0x3c, bytes));

  const double memcpy_ms = TimeMs(stream, options.iters, [&] {
    BENCH_CUDA(
        cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream));
  });
  const double memcpy_gbps = GBps(2.0 * bytes, memcpy_ms);

  std::printf("Cuda(%d) %s (sm_%d%d), %zu MiB per buffer, mean of %d runs\n",
              options.device, props.name, props.major, props.minor, options.mib,
              options.iters);
  std::printf("%-5s %-13s %6s %10s %10s %9s\n", "dtype", "op", "bytes",
              "time(ms)", "GB/s", "vs memcpy");
  std::printf("%-5s %-13s %6s %10.3f %10.1f %9.2f\n", "-", "memcpy d2d", "2x",
              memcpy_ms, memcpy_gbps, 1.0);

  const ReduceOp ops[] = {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMin,
                          ReduceOp::kMax};
  for (int d = 1; d <= 10; ++d) {
    const DType dtype = static_cast<DType>(d);
    const size_t count_elems = bytes / DTypeSize(dtype);
    for (ReduceOp op : ops) {
      const double ms = TimeMs(stream, options.iters, [&] {
        Check(cuda_reduce::ReduceInto(options.device, op, dtype, dst, src,
                                      count_elems, stream));
      });
      const double gbps = GBps(3.0 * bytes, ms);
      std::printf("%-5s %-13s %6s %10.3f %10.1f %9.2f\n",
                  std::string(DTypeName(dtype)).c_str(),
                  std::string(ReduceOpName(op)).c_str(), "3x", ms, gbps,
                  gbps / memcpy_gbps);
      // Keep values bounded: products and sums grow run after run.
      BENCH_CUDA(cudaMemsetAsync(dst, 0x3c, bytes, stream));
    }
    const double ms = TimeMs(stream, options.iters, [&] {
      Check(cuda_reduce::FinalizeAvg(options.device, dtype, dst, count_elems, 3,
                                     stream));
    });
    const double gbps = GBps(2.0 * bytes, ms);
    std::printf("%-5s %-13s %6s %10.3f %10.1f %9.2f\n",
                std::string(DTypeName(dtype)).c_str(), "avg finalize", "2x", ms,
                gbps, gbps / memcpy_gbps);
    BENCH_CUDA(cudaMemsetAsync(dst, 0x3c, bytes, stream));
  }
  BENCH_CUDA(cudaStreamSynchronize(stream));
  BENCH_CUDA(cudaFree(dst));
  BENCH_CUDA(cudaFree(src));
  BENCH_CUDA(cudaStreamDestroy(stream));
  return 0;
}

}  // namespace
}  // namespace chorus

int main(int argc, char** argv) {
  chorus::Options options;
  if (!chorus::ParseOptions(argc, argv, &options)) return 2;
  return chorus::Run(options);
}
