#include "bench/bench_device.h"

#include <algorithm>
#include <utility>

#include "absl/memory/memory.h"
#include "absl/strings/str_cat.h"
#include "common/collective.h"
#include "common/dtype.h"
#include "server/worker/cuda_probe.h"
#include "server/worker/gpu/emulated_device_runtime.h"

namespace chorus::bench {
namespace {

Device Gpu(int index) {
  Device gpu;
  gpu.kind = DeviceKind::kCuda;
  gpu.index = index;
  return gpu;
}

// A tensor of `bytes` bytes of `spec`'s elements at `data` on `device`.
DeviceTensor Tensor(const Device& device, const CollectiveSpec& spec,
                    void* data, uint64_t bytes) {
  DeviceTensor tensor;
  tensor.device = device;
  tensor.data = data;
  tensor.count = bytes / DTypeSize(spec.dtype);
  tensor.dtype = spec.dtype;
  return tensor;
}

}  // namespace

absl::StatusOr<std::unique_ptr<BenchDevice>> BenchDevice::Create(
    absl::string_view name, int rank) {
  if (name == "cpu") {
    return absl::WrapUnique(
        new BenchDevice(JoinOptions::CpuDevice(), nullptr, nullptr));
  }
  if (name == "emulated_cuda") {
    auto emulated = std::make_unique<EmulatedDeviceRuntime>(1);
    DeviceRuntime* runtime = emulated.get();
    return absl::WrapUnique(
        new BenchDevice(Gpu(0), runtime, std::move(emulated)));
  }
  if (name == "cuda") {
    const CudaProbeResult probe = ProbeCuda();
    if (probe.gpus.empty()) {
      return absl::UnavailableError(
          absl::StrCat("--device=cuda: no GPU can be used here: ",
                       probe.unavailable_reason));
    }
    const int gpus = static_cast<int>(probe.gpus.size());
    return absl::WrapUnique(
        new BenchDevice(Gpu(rank % gpus), BuiltInDeviceRuntime(), nullptr));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--device=", name, ": want cpu, cuda or emulated_cuda"));
}

BenchDevice::BenchDevice(Device device, DeviceRuntime* runtime,
                         std::unique_ptr<DeviceRuntime> emulated)
    : device_(std::move(device)),
      runtime_(runtime),
      emulated_(std::move(emulated)) {}

BenchDevice::~BenchDevice() {
  if (!on_gpu()) return;
  const int gpu = device_.index;
  if (stream_ != nullptr) runtime_->DeleteStream(gpu, stream_);
  if (copied_ != nullptr) runtime_->DeleteEvent(gpu, copied_);
  runtime_->FreeDevice(gpu, input_);
  runtime_->FreeDevice(gpu, output_);
}

absl::Status BenchDevice::Load(absl::string_view input, uint64_t output_bytes) {
  if (!on_gpu()) return absl::OkStatus();
  const int gpu = device_.index;
  absl::StatusOr<DeviceRuntime::Stream> stream = runtime_->NewStream(gpu);
  if (!stream.ok()) return stream.status();
  stream_ = *stream;
  absl::StatusOr<DeviceRuntime::Event> event = runtime_->NewEvent(gpu);
  if (!event.ok()) return event.status();
  copied_ = *event;
  absl::StatusOr<void*> in =
      runtime_->AllocDevice(gpu, std::max<uint64_t>(input.size(), 1));
  if (!in.ok()) return in.status();
  input_ = *in;
  absl::StatusOr<void*> out =
      runtime_->AllocDevice(gpu, std::max<uint64_t>(output_bytes, 1));
  if (!out.ok()) return out.status();
  output_ = *out;
  return Copy(input_, input.data(), input.size());
}

absl::StatusOr<CallResult> BenchDevice::Run(Communicator& comm,
                                            const CollectiveSpec& spec,
                                            absl::string_view input,
                                            std::string* output,
                                            const CallOptions& options) {
  if (!on_gpu()) return comm.Run(spec, input, output, options);
  const uint64_t out_bytes = OutputBytes(spec, comm.world_size(), comm.rank());
  return comm.RunOnDevice(spec, Tensor(device_, spec, input_, input.size()),
                          Tensor(device_, spec, output_, out_bytes), options);
}

absl::Status BenchDevice::ReadOutput(uint64_t bytes, std::string* output) {
  if (!on_gpu()) return absl::OkStatus();
  output->resize(bytes);
  return Copy(output->data(), output_, bytes);
}

absl::Status BenchDevice::Copy(void* dst, const void* src, uint64_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  const int gpu = device_.index;
  absl::Status status =
      runtime_->CopyAsync(gpu, dst, src, bytes, stream_, "chorus-bench's copy");
  if (status.ok()) status = runtime_->Record(gpu, copied_, stream_);
  if (status.ok()) status = runtime_->Wait(gpu, copied_, "chorus-bench's copy");
  return status;
}

}  // namespace chorus::bench
