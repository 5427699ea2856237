// The DeviceRuntime of a build with CUDA: the CUDA runtime API and Chorus's
// CUDA kernels. Each operation makes its device current for the calling
// thread and restores the previous one.
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/reduce/cuda/cuda_reduce.h"
#include "server/reduce/cuda/cuda_status.h"
#include "server/worker/gpu/device_runtime.h"
#include "server/worker/gpu/nccl_runtime.h"

namespace chorus {
namespace {

using cuda_reduce::CudaError;
using cuda_reduce::ScopedDevice;

cudaStream_t AsCuda(DeviceRuntime::Stream stream) {
  return reinterpret_cast<cudaStream_t>(stream);
}
cudaEvent_t AsCuda(DeviceRuntime::Event event) {
  return reinterpret_cast<cudaEvent_t>(event);
}

// The driver's cuMemGetAddressRange (an allocation's base and size), found
// through the runtime so that the worker does not link the driver library
// (it starts on machines without a driver); null when the driver has none.
using AddressRangeFn = CUresult (*)(CUdeviceptr*, size_t*, CUdeviceptr);
AddressRangeFn AddressRange() {
  static const AddressRangeFn found = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult result = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 12000,
                                         cudaEnableDefault,
                                         &result) != cudaSuccess ||
        result != cudaDriverEntryPointSuccess) {
      cudaGetLastError();  // not sticky; clear it
      return static_cast<AddressRangeFn>(nullptr);
    }
    return reinterpret_cast<AddressRangeFn>(fn);
  }();
  return found;
}

// cudaLaunchHostFunc's callback: runs and frees EnqueueHost's function.
void CUDART_CB RunHostFn(void* held) {
  auto* fn = static_cast<std::function<void()>*>(held);
  (*fn)();
  delete fn;
}

class CudaDeviceRuntime final : public DeviceRuntime {
 public:
  absl::StatusOr<Stream> NewStream(int device) override {
    ScopedDevice scope;
    if (absl::Status s = scope.Enter(device); !s.ok()) return s;
    cudaStream_t stream = nullptr;
    if (cudaError_t e =
            cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
        e != cudaSuccess) {
      return CudaError(device, e, "creating a stream");
    }
    return reinterpret_cast<Stream>(stream);
  }

  void DeleteStream(int device, Stream stream) override {
    ScopedDevice scope;
    if (stream == nullptr || !scope.Enter(device).ok()) return;
    cudaStreamSynchronize(AsCuda(stream));
    cudaStreamDestroy(AsCuda(stream));
  }

  absl::StatusOr<Event> NewEvent(int device) override {
    ScopedDevice scope;
    if (absl::Status s = scope.Enter(device); !s.ok()) return s;
    cudaEvent_t event = nullptr;
    // A waiting thread blocks instead of spinning.
    if (cudaError_t e = cudaEventCreateWithFlags(
            &event, cudaEventBlockingSync | cudaEventDisableTiming);
        e != cudaSuccess) {
      return CudaError(device, e, "creating an event");
    }
    return reinterpret_cast<Event>(event);
  }

  void DeleteEvent(int device, Event event) override {
    ScopedDevice scope;
    if (event != nullptr && scope.Enter(device).ok()) {
      cudaEventDestroy(AsCuda(event));
    }
  }

  absl::StatusOr<void*> AllocDevice(int device, uint64_t bytes) override {
    ScopedDevice scope;
    if (absl::Status s = scope.Enter(device); !s.ok()) return s;
    void* memory = nullptr;
    if (cudaError_t e = cudaMalloc(&memory, bytes); e != cudaSuccess) {
      return CudaError(device, e,
                       absl::StrCat("allocating ", bytes, " bytes of memory"));
    }
    return memory;
  }

  void FreeDevice(int device, void* memory) override {
    ScopedDevice scope;
    if (memory != nullptr && scope.Enter(device).ok()) cudaFree(memory);
  }

  absl::StatusOr<char*> AllocPinned(int device, uint64_t bytes) override {
    ScopedDevice scope;
    if (absl::Status s = scope.Enter(device); !s.ok()) return s;
    void* memory = nullptr;
    if (cudaError_t e = cudaMallocHost(&memory, bytes); e != cudaSuccess) {
      return CudaError(
          device, e,
          absl::StrCat("allocating ", bytes, " bytes of pinned host memory"));
    }
    return static_cast<char*>(memory);
  }

  void FreePinned(int device, char* memory) override {
    ScopedDevice scope;
    if (memory != nullptr && scope.Enter(device).ok()) cudaFreeHost(memory);
  }

  absl::Status CopyAsync(int device, void* dst, const void* src, uint64_t bytes,
                         Stream stream, absl::string_view doing) override {
    ScopedDevice scope;
    if (absl::Status s = scope.Enter(device); !s.ok()) return s;
    // cudaMemcpyDefault tells host and device memory apart (unified
    // addressing).
    if (cudaError_t e =
            cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, AsCuda(stream));
        e != cudaSuccess) {
      return CudaError(device, e, doing);
    }
    return absl::OkStatus();
  }

  absl::Status Reduce(int device, ReduceOp op, DType dtype, void* dst,
                      const void* a, const void* b, size_t count,
                      Stream stream) override {
    return cuda_reduce::Reduce(device, op, dtype, dst, a, b, count,
                               AsCuda(stream));
  }

  absl::Status FinalizeAvg(int device, DType dtype, void* data, size_t count,
                           int world_size, Stream stream) override {
    return cuda_reduce::FinalizeAvg(device, dtype, data, count, world_size,
                                    AsCuda(stream));
  }

  NcclRuntime* Nccl() override { return BuiltInNcclRuntime(); }

  absl::Status EnqueueHost(int device, Stream stream,
                           std::function<void()> fn) override {
    ScopedDevice scope;
    if (absl::Status s = scope.Enter(device); !s.ok()) return s;
    auto* held = new std::function<void()>(std::move(fn));
    if (cudaError_t e = cudaLaunchHostFunc(AsCuda(stream), RunHostFn, held);
        e != cudaSuccess) {
      delete held;
      return CudaError(device, e, "enqueueing a host function");
    }
    return absl::OkStatus();
  }

  absl::Status Record(int device, Event event, Stream stream) override {
    ScopedDevice scope;
    if (absl::Status s = scope.Enter(device); !s.ok()) return s;
    if (cudaError_t e = cudaEventRecord(AsCuda(event), AsCuda(stream));
        e != cudaSuccess) {
      return CudaError(device, e, "recording an event");
    }
    return absl::OkStatus();
  }

  absl::Status StreamWait(int device, Stream stream, Event event) override {
    ScopedDevice scope;
    if (absl::Status s = scope.Enter(device); !s.ok()) return s;
    if (cudaError_t e = cudaStreamWaitEvent(AsCuda(stream), AsCuda(event), 0);
        e != cudaSuccess) {
      return CudaError(device, e, "ordering a stream after an event");
    }
    return absl::OkStatus();
  }

  absl::Status Wait(int device, Event event, absl::string_view what) override {
    ScopedDevice scope;
    if (absl::Status s = scope.Enter(device); !s.ok()) return s;
    if (cudaError_t e = cudaEventSynchronize(AsCuda(event)); e != cudaSuccess) {
      return CudaError(device, e, absl::StrCat("waiting for ", what));
    }
    return absl::OkStatus();
  }

  absl::Status CheckPointer(int device, const void* ptr, uint64_t bytes,
                            absl::string_view what) override {
    if (bytes == 0) return absl::OkStatus();
    ScopedDevice scope;
    if (absl::Status s = scope.Enter(device); !s.ok()) return s;
    cudaPointerAttributes attributes = {};
    if (cudaError_t e = cudaPointerGetAttributes(&attributes, ptr);
        e != cudaSuccess) {
      return CudaError(device, e, absl::StrCat("looking up the ", what));
    }
    const bool on_gpu = attributes.type == cudaMemoryTypeDevice ||
                        attributes.type == cudaMemoryTypeManaged;
    const std::string named =
        absl::StrCat(Name(device), ": the ", what, " 0x",
                     absl::Hex(reinterpret_cast<uintptr_t>(ptr)));
    if (!on_gpu || attributes.device != device) {
      return absl::InvalidArgumentError(
          absl::StrCat(named, " is not memory of this GPU"));
    }
    // The whole range: an over-long count would fault the context for good.
    CUdeviceptr base = 0;
    size_t size = 0;
    const CUdeviceptr at = reinterpret_cast<CUdeviceptr>(ptr);
    if (AddressRangeFn range = AddressRange();
        range != nullptr && range(&base, &size, at) == CUDA_SUCCESS &&
        bytes > base + size - at) {
      return absl::InvalidArgumentError(
          absl::StrCat(named, " has ", base + size - at,
                       " bytes of this GPU's memory behind it, not ", bytes));
    }
    return absl::OkStatus();
  }
};

}  // namespace

DeviceRuntime* BuiltInDeviceRuntime() {
  static CudaDeviceRuntime* const runtime = new CudaDeviceRuntime();
  return runtime;
}

}  // namespace chorus
