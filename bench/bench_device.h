// BenchDevice: where a chorus-bench rank keeps its buffers (--device).
//   cpu            host memory; calls through Communicator::Run.
//   cuda           memory of GPU Cuda(rank mod the GPUs found), by pointer:
//                  calls through Communicator::RunOnDevice, as an application
//                  whose tensors live on the GPU (its worker reduces there).
//   emulated_cuda  the same on a GPU emulated in host memory
//                  (EmulatedDeviceRuntime), so that the benchmark's GPU path
//                  runs on machines without one; its times say nothing of a
//                  GPU's.
// The input is copied to the device once; the output stays there and is
// copied back only to be checked (ReadOutput).
//
// Lifecycle: one per rank process, made before its worker starts (the
// worker takes worker_runtime()) and outliving it.
// Thread safety: thread-compatible.
#ifndef CHORUS_BENCH_BENCH_DEVICE_H_
#define CHORUS_BENCH_BENCH_DEVICE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "chorus/communicator.h"
#include "server/worker/gpu/device_runtime.h"

namespace chorus::bench {

class BenchDevice {
 public:
  // The device named `name` (cpu, cuda, emulated_cuda) for rank `rank`.
  // INVALID_ARGUMENT for another name; UNAVAILABLE for cuda where no GPU
  // can be used (saying why).
  static absl::StatusOr<std::unique_ptr<BenchDevice>> Create(
      absl::string_view name, int rank);
  ~BenchDevice();
  BenchDevice(const BenchDevice&) = delete;
  BenchDevice& operator=(const BenchDevice&) = delete;

  // The device the rank registers and joins on.
  const Device& device() const { return device_; }
  // The device runtime its worker must use: the emulation's, or null (the
  // worker's own: CUDA's).
  DeviceRuntime* worker_runtime() const { return emulated_.get(); }

  // Holds `input` (the largest input of the sweep; shorter ones are its
  // prefixes) and room for outputs of up to `output_bytes`. Returns the
  // runtime's errors (RESOURCE_EXHAUSTED: no memory).
  absl::Status Load(absl::string_view input, uint64_t output_bytes);

  // Runs `spec` on the first input.size() bytes of the loaded input (cpu:
  // on `input` itself, output into `output`). Returns the call's result.
  absl::StatusOr<CallResult> Run(Communicator& comm, const CollectiveSpec& spec,
                                 absl::string_view input, std::string* output,
                                 const CallOptions& options);

  // Copies the last call's first `bytes` bytes of output into `output`
  // (cpu: nothing to do).
  absl::Status ReadOutput(uint64_t bytes, std::string* output);

 private:
  BenchDevice(Device device, DeviceRuntime* runtime,
              std::unique_ptr<DeviceRuntime> emulated);
  bool on_gpu() const { return runtime_ != nullptr; }
  // Copies `bytes` bytes from `src` to `dst` and waits.
  absl::Status Copy(void* dst, const void* src, uint64_t bytes);

  const Device device_;
  // Null for cpu; the emulation's or CUDA's.
  DeviceRuntime* const runtime_;
  const std::unique_ptr<DeviceRuntime> emulated_;
  DeviceRuntime::Stream stream_ = nullptr;
  DeviceRuntime::Event copied_ = nullptr;
  void* input_ = nullptr;
  void* output_ = nullptr;
};

}  // namespace chorus::bench

#endif  // CHORUS_BENCH_BENCH_DEVICE_H_
