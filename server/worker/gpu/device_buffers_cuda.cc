// DeviceBuffers with CUDA: staging sets of a stream, events, a device work
// buffer, two pinned+device slots for received chunks and a pinned read
// buffer for chunks to send.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/collective_metrics.h"
#include "server/reduce/cuda/cuda_reduce.h"
#include "server/reduce/cuda/cuda_status.h"
#include "server/worker/gpu/device_buffers.h"

namespace chorus {
namespace {

using cuda_reduce::CudaError;
using cuda_reduce::ScopedDevice;

// Host staging for one received chunk and its copy on the device. `done`
// is recorded after the work that reads them, so the slot may be refilled
// once it completed.
struct Slot {
  char* host = nullptr;  // pinned
  uint64_t host_capacity = 0;
  void* device = nullptr;
  uint64_t device_capacity = 0;
  cudaEvent_t done = nullptr;
};

// Everything one call on one GPU uses. Destroyed with its device current.
struct StagingSet {
  int device = 0;
  cudaStream_t stream = nullptr;
  void* work = nullptr;
  uint64_t work_capacity = 0;
  Slot slots[2];
  char* read_host = nullptr;  // pinned
  uint64_t read_capacity = 0;
  cudaEvent_t read_done = nullptr;

  // Device and pinned host memory held.
  uint64_t held_bytes() const {
    uint64_t bytes = work_capacity + read_capacity;
    for (const Slot& slot : slots) {
      bytes += slot.device_capacity + slot.host_capacity;
    }
    return bytes;
  }

  ~StagingSet() {
    ScopedDevice scope;
    if (!scope.Enter(device).ok()) return;
    if (stream != nullptr) cudaStreamSynchronize(stream);
    for (Slot& slot : slots) {
      if (slot.host != nullptr) cudaFreeHost(slot.host);
      if (slot.device != nullptr) cudaFree(slot.device);
      if (slot.done != nullptr) cudaEventDestroy(slot.done);
    }
    if (read_host != nullptr) cudaFreeHost(read_host);
    if (read_done != nullptr) cudaEventDestroy(read_done);
    if (work != nullptr) cudaFree(work);
    if (stream != nullptr) cudaStreamDestroy(stream);
  }
};

absl::StatusOr<std::unique_ptr<StagingSet>> NewStagingSet(int device) {
  ScopedDevice scope;
  if (absl::Status s = scope.Enter(device); !s.ok()) return s;
  auto set = std::make_unique<StagingSet>();
  set->device = device;
  if (cudaError_t e =
          cudaStreamCreateWithFlags(&set->stream, cudaStreamNonBlocking);
      e != cudaSuccess) {
    return CudaError(device, e, "creating a stream");
  }
  const unsigned event_flags = cudaEventBlockingSync | cudaEventDisableTiming;
  for (Slot& slot : set->slots) {
    if (cudaError_t e = cudaEventCreateWithFlags(&slot.done, event_flags);
        e != cudaSuccess) {
      return CudaError(device, e, "creating an event");
    }
  }
  if (cudaError_t e = cudaEventCreateWithFlags(&set->read_done, event_flags);
      e != cudaSuccess) {
    return CudaError(device, e, "creating an event");
  }
  return set;
}

// Grows device memory `*ptr` of `*capacity` bytes to at least `bytes`. The
// old contents are dropped; callers grow only memory no pending work uses.
absl::Status GrowDevice(int device, void** ptr, uint64_t* capacity,
                        uint64_t bytes) {
  if (*capacity >= bytes) return absl::OkStatus();
  if (*ptr != nullptr) cudaFree(*ptr);
  *ptr = nullptr;
  *capacity = 0;
  if (cudaError_t e = cudaMalloc(ptr, bytes); e != cudaSuccess) {
    *ptr = nullptr;
    return CudaError(device, e,
                     absl::StrCat("allocating ", bytes, " bytes of memory"));
  }
  *capacity = bytes;
  return absl::OkStatus();
}

absl::Status GrowPinned(int device, char** ptr, uint64_t* capacity,
                        uint64_t bytes) {
  if (*capacity >= bytes) return absl::OkStatus();
  if (*ptr != nullptr) cudaFreeHost(*ptr);
  *ptr = nullptr;
  *capacity = 0;
  void* fresh = nullptr;
  if (cudaError_t e = cudaMallocHost(&fresh, bytes); e != cudaSuccess) {
    return CudaError(device, e,
                     absl::StrCat("allocating ", bytes,
                                  " bytes of pinned "
                                  "host memory"));
  }
  *ptr = static_cast<char*>(fresh);
  *capacity = bytes;
  return absl::OkStatus();
}

// Returns OK when `ptr` is memory of GPU `device` (device or managed);
// INVALID_ARGUMENT naming `what` otherwise. Never touches the memory, so a
// stray pointer is refused instead of read.
absl::Status CheckDevicePointer(int device, const void* ptr,
                                absl::string_view what) {
  cudaPointerAttributes attributes = {};
  cudaError_t error = cudaPointerGetAttributes(&attributes, ptr);
  if (error != cudaSuccess) {
    return CudaError(device, error, absl::StrCat("looking up the ", what));
  }
  const bool on_gpu = attributes.type == cudaMemoryTypeDevice ||
                      attributes.type == cudaMemoryTypeManaged;
  if (!on_gpu || attributes.device != device) {
    return absl::InvalidArgumentError(
        absl::StrCat(cuda_reduce::CudaDeviceName(device), ": the ", what, " ",
                     "0x", absl::Hex(reinterpret_cast<uintptr_t>(ptr)),
                     " is not memory of this GPU"));
  }
  return absl::OkStatus();
}

// Waits, blocking, for `event` (an event never recorded is complete).
absl::Status WaitFor(int device, cudaEvent_t event, absl::string_view what) {
  if (cudaError_t e = cudaEventSynchronize(event); e != cudaSuccess) {
    return CudaError(device, e, absl::StrCat("waiting for ", what));
  }
  return absl::OkStatus();
}

}  // namespace

struct DeviceBuffers::Pool {
  Pool(int max_sets, uint64_t max_bytes)
      : max_idle_sets(max_sets), max_idle_bytes(max_bytes) {}

  // Returns an idle set of `device`, or a new one.
  absl::StatusOr<std::unique_ptr<StagingSet>> Take(int device) {
    {
      absl::MutexLock lock(&mu);
      auto it = idle.find(device);
      if (it != idle.end() && !it->second.empty()) {
        std::unique_ptr<StagingSet> set = std::move(it->second.back());
        it->second.pop_back();
        idle_bytes[device] -= set->held_bytes();
        return set;
      }
    }
    return NewStagingSet(device);
  }

  // Keeps a healthy set for reuse within the bounds; frees it otherwise.
  void Give(std::unique_ptr<StagingSet> set, bool healthy) {
    if (!healthy || set == nullptr) return;  // the destructor frees it
    const int device = set->device;
    const uint64_t bytes = set->held_bytes();
    {
      absl::MutexLock lock(&mu);
      std::vector<std::unique_ptr<StagingSet>>& sets = idle[device];
      if (static_cast<int>(sets.size()) < max_idle_sets &&
          idle_bytes[device] + bytes <= max_idle_bytes) {
        idle_bytes[device] += bytes;
        sets.push_back(std::move(set));
        return;
      }
    }
    // `set` is freed here, outside the lock.
  }

  const int max_idle_sets;
  const uint64_t max_idle_bytes;
  mutable absl::Mutex mu;
  std::map<int, std::vector<std::unique_ptr<StagingSet>>> idle
      ABSL_GUARDED_BY(mu);
  std::map<int, uint64_t> idle_bytes ABSL_GUARDED_BY(mu);
};

namespace {

class CudaReduceBuffer : public DeviceReduceBuffer {
 public:
  CudaReduceBuffer(DeviceBuffers::Pool* pool, std::unique_ptr<StagingSet> set,
                   const CollectiveSpec& spec, uint64_t bytes)
      : pool_(pool),
        set_(std::move(set)),
        device_(set_->device),
        op_(spec.op),
        dtype_(spec.dtype),
        size_(bytes) {}

  ~CudaReduceBuffer() override {
    // Pending copies still read the slots: let them finish first.
    if (healthy_) healthy_ = Sync("the call's last copies").ok();
    pool_->Give(std::move(set_), healthy_);
  }

  // Sizes the work buffer and fills it from `input` (host or device memory;
  // cudaMemcpyDefault tells them apart).
  absl::Status Load(const void* input) {
    ScopedDevice scope;
    if (absl::Status s = Check(scope.Enter(device_)); !s.ok()) return s;
    if (absl::Status s = Check(
            GrowDevice(device_, &set_->work, &set_->work_capacity, size_));
        !s.ok()) {
      return s;
    }
    if (size_ == 0) return absl::OkStatus();
    return Check(device_,
                 cudaMemcpyAsync(set_->work, input, size_, cudaMemcpyDefault,
                                 set_->stream),
                 "copying the input to the device");
  }

  uint64_t size() const override { return size_; }

  absl::StatusOr<absl::string_view> Read(const Range& range) override {
    if (absl::Status s = CheckRange(range, size_); !s.ok()) return s;
    if (absl::Status s = Usable(); !s.ok()) return s;
    ScopedDevice scope;
    if (absl::Status s = Check(scope.Enter(device_)); !s.ok()) return s;
    // No copy is pending into read_host (Read waits for its own), so it
    // may be regrown.
    if (absl::Status s = Check(GrowPinned(device_, &set_->read_host,
                                          &set_->read_capacity, range.size));
        !s.ok()) {
      return s;
    }
    if (range.size > 0) {
      if (absl::Status s =
              Check(device_,
                    cudaMemcpyAsync(set_->read_host, Work(range), range.size,
                                    cudaMemcpyDeviceToHost, set_->stream),
                    "copying a chunk off the device");
          !s.ok()) {
        return s;
      }
      if (absl::Status s =
              Check(device_, cudaEventRecord(set_->read_done, set_->stream),
                    "recording an event");
          !s.ok()) {
        return s;
      }
      if (absl::Status s =
              Check(WaitFor(device_, set_->read_done, "a chunk to send"));
          !s.ok()) {
        return s;
      }
    }
    return absl::string_view(set_->read_host, range.size);
  }

  absl::Status Combine(const Range& range, absl::string_view data,
                       bool data_first) override {
    ScopedDevice scope;
    Slot* slot = nullptr;
    if (absl::Status s = Stage(range, data, scope, &slot); !s.ok()) return s;
    if (range.size == 0) return absl::OkStatus();
    void* dst = Work(range);
    const void* a = data_first ? slot->device : dst;
    const void* b = data_first ? dst : slot->device;
    if (absl::Status s =
            Check(device_,
                  cudaMemcpyAsync(slot->device, slot->host, range.size,
                                  cudaMemcpyHostToDevice, set_->stream),
                  "copying a received chunk to the device");
        !s.ok()) {
      return s;
    }
    if (absl::Status s = Check(
            cuda_reduce::Reduce(device_, op_, dtype_, dst, a, b,
                                range.size / DTypeSize(dtype_), set_->stream));
        !s.ok()) {
      return s;
    }
    RecordReduce("cuda", range.size, -absl::Nanoseconds(1));
    return Check(device_, cudaEventRecord(slot->done, set_->stream),
                 "recording an event");
  }

  absl::Status Store(const Range& range, absl::string_view data) override {
    ScopedDevice scope;
    Slot* slot = nullptr;
    if (absl::Status s = Stage(range, data, scope, &slot); !s.ok()) return s;
    if (range.size == 0) return absl::OkStatus();
    if (absl::Status s =
            Check(device_,
                  cudaMemcpyAsync(Work(range), slot->host, range.size,
                                  cudaMemcpyHostToDevice, set_->stream),
                  "copying a received chunk to the device");
        !s.ok()) {
      return s;
    }
    return Check(device_, cudaEventRecord(slot->done, set_->stream),
                 "recording an event");
  }

  absl::Status FinalizeAvg(const Range& range, int world_size) override {
    if (absl::Status s = CheckRange(range, size_); !s.ok()) return s;
    if (absl::Status s = Usable(); !s.ok()) return s;
    if (range.size == 0) return absl::OkStatus();
    return Check(cuda_reduce::FinalizeAvg(device_, dtype_, Work(range),
                                          range.size / DTypeSize(dtype_),
                                          world_size, set_->stream));
  }

  absl::Status CopyToHost(std::string* out) override {
    if (absl::Status s = Usable(); !s.ok()) return s;
    out->resize(size_);
    if (size_ == 0) return absl::OkStatus();
    ScopedDevice scope;
    if (absl::Status s = Check(scope.Enter(device_)); !s.ok()) return s;
    if (absl::Status s =
            Check(device_,
                  cudaMemcpyAsync(out->data(), set_->work, size_,
                                  cudaMemcpyDeviceToHost, set_->stream),
                  "copying the result off the device");
        !s.ok()) {
      return s;
    }
    return Sync("the result");
  }

  absl::Status CopyToDevice(void* dst) override {
    if (absl::Status s = Usable(); !s.ok()) return s;
    if (size_ == 0) return absl::OkStatus();
    ScopedDevice scope;
    if (absl::Status s = Check(scope.Enter(device_)); !s.ok()) return s;
    if (absl::Status s = CheckDevicePointer(device_, dst, "output pointer");
        !s.ok()) {
      return s;  // the buffer itself is fine
    }
    if (absl::Status s = Check(device_,
                               cudaMemcpyAsync(dst, set_->work, size_,
                                               cudaMemcpyDefault, set_->stream),
                               "copying the result to the output");
        !s.ok()) {
      return s;
    }
    return Sync("the result");
  }

 private:
  char* Work(const Range& range) const {
    return static_cast<char*>(set_->work) + range.offset;
  }

  absl::Status Usable() const {
    if (healthy_) return absl::OkStatus();
    return absl::FailedPreconditionError(
        absl::StrCat(cuda_reduce::CudaDeviceName(device_),
                     ": this call's device buffer failed earlier"));
  }

  // Marks the buffer unhealthy when `status` is an error; returns it.
  absl::Status Check(absl::Status status) {
    if (!status.ok()) healthy_ = false;
    return status;
  }
  absl::Status Check(int device, cudaError_t error, absl::string_view doing) {
    if (error == cudaSuccess) return absl::OkStatus();
    return Check(CudaError(device, error, doing));
  }

  // Waits for everything enqueued on the call's stream.
  absl::Status Sync(absl::string_view what) {
    ScopedDevice scope;
    if (absl::Status s = Check(scope.Enter(device_)); !s.ok()) return s;
    if (absl::Status s =
            Check(device_, cudaEventRecord(set_->read_done, set_->stream),
                  "recording an event");
        !s.ok()) {
      return s;
    }
    return Check(WaitFor(device_, set_->read_done, what));
  }

  // Checks `range` and `data`, enters the device, picks the next slot, waits
  // until its previous chunk was used, grows it and copies `data` into its
  // pinned host memory.
  absl::Status Stage(const Range& range, absl::string_view data,
                     ScopedDevice& scope, Slot** slot_out) {
    if (absl::Status s = CheckRange(range, size_, data.size()); !s.ok()) {
      return s;
    }
    if (absl::Status s = Usable(); !s.ok()) return s;
    if (absl::Status s = Check(scope.Enter(device_)); !s.ok()) return s;
    Slot& slot = set_->slots[next_slot_];
    next_slot_ ^= 1;
    if (absl::Status s = Check(WaitFor(device_, slot.done, "a staging slot"));
        !s.ok()) {
      return s;
    }
    if (absl::Status s = Check(
            GrowPinned(device_, &slot.host, &slot.host_capacity, range.size));
        !s.ok()) {
      return s;
    }
    if (absl::Status s = Check(GrowDevice(device_, &slot.device,
                                          &slot.device_capacity, range.size));
        !s.ok()) {
      return s;
    }
    if (!data.empty()) std::memcpy(slot.host, data.data(), data.size());
    *slot_out = &slot;
    return absl::OkStatus();
  }

  DeviceBuffers::Pool* const pool_;  // not owned
  std::unique_ptr<StagingSet> set_;
  const int device_;
  const ReduceOp op_;
  const DType dtype_;
  const uint64_t size_;
  int next_slot_ = 0;
  bool healthy_ = true;
};

}  // namespace

DeviceBuffers::DeviceBuffers(int max_idle_sets, uint64_t max_idle_bytes)
    : pool_(std::make_unique<Pool>(max_idle_sets, max_idle_bytes)) {}

DeviceBuffers::~DeviceBuffers() = default;

namespace {

// Checks a user pointer on `device` for `bytes` bytes (null allowed when 0).
absl::Status CheckUserPointer(int device, const void* ptr, uint64_t bytes,
                              absl::string_view what) {
  if (bytes == 0) return absl::OkStatus();
  ScopedDevice scope;
  if (absl::Status s = scope.Enter(device); !s.ok()) return s;
  return CheckDevicePointer(device, ptr, what);
}

}  // namespace

absl::Status DeviceBuffers::CheckPointer(int device, const void* ptr,
                                         uint64_t bytes,
                                         absl::string_view what) {
  return CheckUserPointer(device, ptr, bytes, what);
}

absl::StatusOr<std::unique_ptr<DeviceReduceBuffer>> DeviceBuffers::FromDevice(
    int device, const CollectiveSpec& spec, const void* input, uint64_t bytes) {
  if (absl::Status s = CheckUserPointer(device, input, bytes, "input pointer");
      !s.ok()) {
    return s;
  }
  return Make(device, spec, input, bytes);
}

absl::StatusOr<std::unique_ptr<DeviceReduceBuffer>> DeviceBuffers::FromHost(
    int device, const CollectiveSpec& spec, absl::string_view input) {
  return Make(device, spec, input.data(), input.size());
}

absl::StatusOr<std::unique_ptr<DeviceReduceBuffer>> DeviceBuffers::Make(
    int device, const CollectiveSpec& spec, const void* input, uint64_t bytes) {
  absl::StatusOr<std::unique_ptr<StagingSet>> set = pool_->Take(device);
  if (!set.ok()) return set.status();
  auto buffer = std::make_unique<CudaReduceBuffer>(pool_.get(), *std::move(set),
                                                   spec, bytes);
  if (absl::Status s = buffer->Load(input); !s.ok()) return s;
  return buffer;
}

absl::Status DeviceBuffers::Copy(int device, void* dst, const void* src,
                                 uint64_t bytes) {
  absl::StatusOr<std::unique_ptr<StagingSet>> set = pool_->Take(device);
  if (!set.ok()) return set.status();
  ScopedDevice scope;
  absl::Status status = scope.Enter(device);
  if (status.ok()) {
    cudaError_t e =
        cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, (*set)->stream);
    if (e == cudaSuccess)
      e = cudaEventRecord((*set)->read_done, (*set)->stream);
    status = e == cudaSuccess ? WaitFor(device, (*set)->read_done, "a copy")
                              : CudaError(device, e, "copying");
  }
  pool_->Give(*std::move(set), status.ok());
  return status;
}

absl::Status DeviceBuffers::CopyFromDevice(int device, const void* src,
                                           uint64_t bytes, std::string* out) {
  if (absl::Status s = CheckUserPointer(device, src, bytes, "input pointer");
      !s.ok()) {
    return s;
  }
  out->resize(bytes);
  if (bytes == 0) return absl::OkStatus();
  return Copy(device, out->data(), src, bytes);
}

absl::Status DeviceBuffers::CopyToDevice(int device, absl::string_view src,
                                         void* dst) {
  if (absl::Status s =
          CheckUserPointer(device, dst, src.size(), "output pointer");
      !s.ok()) {
    return s;
  }
  if (src.empty()) return absl::OkStatus();
  return Copy(device, dst, src.data(), src.size());
}

int DeviceBuffers::idle_sets() const {
  absl::MutexLock lock(&pool_->mu);
  int sets = 0;
  for (const auto& [device, idle] : pool_->idle) {
    sets += static_cast<int>(idle.size());
  }
  return sets;
}

}  // namespace chorus
