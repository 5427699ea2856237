// DeviceBuffers over a DeviceRuntime: staging sets of a stream, events, a
// device work buffer, two pinned+device slots for received chunks and a
// pinned read buffer for chunks to send.
#include "server/worker/gpu/device_buffers.h"

#include <glog/logging.h>

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
#include "common/device.h"
#include "server/worker/gpu/device_runtime.h"

namespace chorus {
namespace {

using Stream = DeviceRuntime::Stream;
using Event = DeviceRuntime::Event;

// Host staging for one received chunk and its copy on the device. `done`
// is recorded after the work that reads them, so the slot may be refilled
// once it completed.
struct Slot {
  char* host = nullptr;  // pinned
  uint64_t host_capacity = 0;
  void* device = nullptr;
  uint64_t device_capacity = 0;
  Event done = nullptr;
};

// Everything one call on one GPU uses.
struct StagingSet {
  DeviceRuntime* runtime = nullptr;  // not owned
  int device = 0;
  Stream stream = nullptr;
  void* work = nullptr;
  uint64_t work_capacity = 0;
  Slot slots[2];
  char* read_host = nullptr;  // pinned
  uint64_t read_capacity = 0;
  Event read_done = nullptr;
  // Recorded on a caller's stream that wrote an input, and on `stream`
  // after an output a caller's stream is ordered after.
  Event input_written = nullptr;
  Event output_written = nullptr;
  // Whether a call handed its last copy to a caller's stream without the
  // host waiting: that copy may still read `work`.
  bool handed_off = false;

  // Device and pinned host memory held.
  uint64_t held_bytes() const {
    uint64_t bytes = work_capacity + read_capacity;
    for (const Slot& slot : slots) {
      bytes += slot.device_capacity + slot.host_capacity;
    }
    return bytes;
  }

  ~StagingSet() {
    // The stream's work ends first: it may still read the memory.
    if (stream != nullptr) runtime->DeleteStream(device, stream);
    for (Slot& slot : slots) {
      runtime->FreePinned(device, slot.host);
      runtime->FreeDevice(device, slot.device);
      if (slot.done != nullptr) runtime->DeleteEvent(device, slot.done);
    }
    runtime->FreePinned(device, read_host);
    for (Event event : {read_done, input_written, output_written}) {
      if (event != nullptr) runtime->DeleteEvent(device, event);
    }
    runtime->FreeDevice(device, work);
  }
};

absl::StatusOr<std::unique_ptr<StagingSet>> NewStagingSet(
    DeviceRuntime* runtime, int device) {
  auto set = std::make_unique<StagingSet>();
  set->runtime = runtime;
  set->device = device;
  absl::StatusOr<Stream> stream = runtime->NewStream(device);
  if (!stream.ok()) return stream.status();
  set->stream = *stream;
  for (Event* event :
       {&set->slots[0].done, &set->slots[1].done, &set->read_done,
        &set->input_written, &set->output_written}) {
    absl::StatusOr<Event> made = runtime->NewEvent(device);
    if (!made.ok()) return made.status();
    *event = *made;
  }
  return set;
}

// Grows device memory `*ptr` of `*capacity` bytes to at least `bytes`. The
// old contents are dropped; callers grow only memory no pending work uses.
absl::Status GrowDevice(StagingSet& set, void** ptr, uint64_t* capacity,
                        uint64_t bytes) {
  if (*capacity >= bytes) return absl::OkStatus();
  set.runtime->FreeDevice(set.device, *ptr);
  *ptr = nullptr;
  *capacity = 0;
  absl::StatusOr<void*> fresh = set.runtime->AllocDevice(set.device, bytes);
  if (!fresh.ok()) return fresh.status();
  *ptr = *fresh;
  *capacity = bytes;
  return absl::OkStatus();
}

absl::Status GrowPinned(StagingSet& set, char** ptr, uint64_t* capacity,
                        uint64_t bytes) {
  if (*capacity >= bytes) return absl::OkStatus();
  set.runtime->FreePinned(set.device, *ptr);
  *ptr = nullptr;
  *capacity = 0;
  absl::StatusOr<char*> fresh = set.runtime->AllocPinned(set.device, bytes);
  if (!fresh.ok()) return fresh.status();
  *ptr = *fresh;
  *capacity = bytes;
  return absl::OkStatus();
}

// Orders the set's stream after the work enqueued on the caller's stream
// `after` so far (null: nothing to wait for). The host does not wait.
absl::Status WaitOnGpuFor(StagingSet& set, void* after) {
  if (after == nullptr) return absl::OkStatus();
  if (absl::Status s = set.runtime->Record(set.device, set.input_written,
                                           static_cast<Stream>(after));
      !s.ok()) {
    return s;
  }
  return set.runtime->StreamWait(set.device, set.stream, set.input_written);
}

// Orders the caller's stream `then` after the work enqueued on the set's
// stream so far, which the host then need not wait for.
absl::Status HandOff(StagingSet& set, void* then) {
  if (absl::Status s =
          set.runtime->Record(set.device, set.output_written, set.stream);
      !s.ok()) {
    return s;
  }
  set.handed_off = true;
  return set.runtime->StreamWait(set.device, static_cast<Stream>(then),
                                 set.output_written);
}

}  // namespace

struct DeviceBuffers::Pool {
  Pool(DeviceRuntime* device_runtime, int max_sets, uint64_t max_bytes)
      : runtime(device_runtime),
        max_idle_sets(max_sets),
        max_idle_bytes(max_bytes) {}

  // Returns an idle set of `device`, or a new one; the refusal once the
  // device faulted.
  absl::StatusOr<std::unique_ptr<StagingSet>> Take(int device) {
    {
      absl::MutexLock lock(&mu);
      if (absl::Status refused = WithdrawnLocked(device); !refused.ok()) {
        return refused;
      }
      auto it = idle.find(device);
      if (it != idle.end() && !it->second.empty()) {
        std::unique_ptr<StagingSet> set = std::move(it->second.back());
        it->second.pop_back();
        idle_bytes[device] -= set->held_bytes();
        return set;
      }
    }
    return NewStagingSet(runtime, device);
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

  // Records that `device` faulted when `status` says so (INTERNAL: a CUDA
  // context that failed stays failed), dropping its idle sets. Returns
  // `status`.
  absl::Status Noted(int device, absl::Status status) {
    if (status.code() != absl::StatusCode::kInternal) return status;
    std::vector<std::unique_ptr<StagingSet>> dropped;
    absl::MutexLock lock(&mu);
    if (faults.emplace(device, status).second) {
      dropped = std::move(idle[device]);
      idle.erase(device);
      idle_bytes[device] = 0;
      LOG(ERROR) << status << "; withdrawing " << DeviceRuntime::Name(device);
    }
    return status;
  }

  absl::Status WithdrawnLocked(int device) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    auto it = faults.find(device);
    if (it == faults.end()) return absl::OkStatus();
    Device gpu;
    gpu.kind = DeviceKind::kCuda;
    gpu.index = device;
    return UnsupportedDeviceError(
        gpu, absl::StrCat("it faulted (", it->second.message(),
                          "); restart the worker to use it again"));
  }

  DeviceRuntime* const runtime;  // not owned
  const int max_idle_sets;
  const uint64_t max_idle_bytes;
  mutable absl::Mutex mu;
  std::map<int, std::vector<std::unique_ptr<StagingSet>>> idle
      ABSL_GUARDED_BY(mu);
  std::map<int, uint64_t> idle_bytes ABSL_GUARDED_BY(mu);
  // Devices that faulted, with the fault.
  std::map<int, absl::Status> faults ABSL_GUARDED_BY(mu);
};

namespace {

class StagedReduceBuffer : public DeviceReduceBuffer {
 public:
  StagedReduceBuffer(DeviceBuffers::Pool* pool, std::unique_ptr<StagingSet> set,
                     const CollectiveSpec& spec, uint64_t bytes)
      : pool_(pool),
        set_(std::move(set)),
        runtime_(set_->runtime),
        device_(set_->device),
        op_(spec.op),
        dtype_(spec.dtype),
        size_(bytes) {}

  ~StagedReduceBuffer() override {
    // Pending copies still read the slots: let them finish first, unless
    // the last copy was handed to a caller's stream (the set's next user
    // enqueues behind it on the same stream).
    if (healthy_ && !set_->handed_off) {
      healthy_ = Sync("the call's last copies").ok();
    }
    pool_->Give(std::move(set_), healthy_);
  }

  // Sizes the work buffer and fills it from `input` (host or device memory)
  // once stream `after`'s work so far completed.
  absl::Status Load(const void* input, void* after) {
    // A copy an earlier call handed off may still read the work buffer.
    if (set_->handed_off && set_->work_capacity < size_) {
      if (absl::Status s = Sync("an earlier call's last copy"); !s.ok()) {
        return s;
      }
    }
    set_->handed_off = false;
    if (absl::Status s = Check(WaitOnGpuFor(*set_, after)); !s.ok()) return s;
    if (absl::Status s =
            Check(GrowDevice(*set_, &set_->work, &set_->work_capacity, size_));
        !s.ok()) {
      return s;
    }
    if (size_ == 0) return absl::OkStatus();
    return Check(runtime_->CopyAsync(device_, set_->work, input, size_,
                                     set_->stream,
                                     "copying the input to the device"));
  }

  uint64_t size() const override { return size_; }

  absl::StatusOr<absl::string_view> Read(const Range& range) override {
    if (absl::Status s = CheckRange(range, size_); !s.ok()) return s;
    if (absl::Status s = Usable(); !s.ok()) return s;
    // No copy is pending into read_host (Read waits for its own), so it
    // may be regrown.
    if (absl::Status s = Check(GrowPinned(*set_, &set_->read_host,
                                          &set_->read_capacity, range.size));
        !s.ok()) {
      return s;
    }
    if (range.size > 0) {
      if (absl::Status s = Check(runtime_->CopyAsync(
              device_, set_->read_host, Work(range), range.size, set_->stream,
              "copying a chunk off the device"));
          !s.ok()) {
        return s;
      }
      if (absl::Status s = Sync("a chunk to send"); !s.ok()) return s;
    }
    return absl::string_view(set_->read_host, range.size);
  }

  absl::Status Combine(const Range& range, absl::string_view data,
                       bool data_first) override {
    Slot* slot = nullptr;
    if (absl::Status s = Stage(range, data, &slot); !s.ok()) return s;
    if (range.size == 0) return absl::OkStatus();
    void* dst = Work(range);
    const void* a = data_first ? slot->device : dst;
    const void* b = data_first ? dst : slot->device;
    if (absl::Status s = Check(runtime_->CopyAsync(
            device_, slot->device, slot->host, range.size, set_->stream,
            "copying a received chunk to the device"));
        !s.ok()) {
      return s;
    }
    if (absl::Status s = Check(runtime_->Reduce(device_, op_, dtype_, dst, a, b,
                                                range.size / DTypeSize(dtype_),
                                                set_->stream));
        !s.ok()) {
      return s;
    }
    RecordReduce("cuda", range.size, -absl::Nanoseconds(1));
    return Check(runtime_->Record(device_, slot->done, set_->stream));
  }

  absl::Status Store(const Range& range, absl::string_view data) override {
    Slot* slot = nullptr;
    if (absl::Status s = Stage(range, data, &slot); !s.ok()) return s;
    if (range.size == 0) return absl::OkStatus();
    if (absl::Status s = Check(runtime_->CopyAsync(
            device_, Work(range), slot->host, range.size, set_->stream,
            "copying a received chunk to the device"));
        !s.ok()) {
      return s;
    }
    return Check(runtime_->Record(device_, slot->done, set_->stream));
  }

  absl::Status FinalizeAvg(const Range& range, int world_size) override {
    if (absl::Status s = CheckRange(range, size_); !s.ok()) return s;
    if (absl::Status s = Usable(); !s.ok()) return s;
    if (range.size == 0) return absl::OkStatus();
    return Check(runtime_->FinalizeAvg(device_, dtype_, Work(range),
                                       range.size / DTypeSize(dtype_),
                                       world_size, set_->stream));
  }

  absl::Status CopyToHost(std::string* out) override {
    if (absl::Status s = Usable(); !s.ok()) return s;
    out->resize(size_);
    if (size_ == 0) return absl::OkStatus();
    if (absl::Status s = Check(runtime_->CopyAsync(
            device_, out->data(), set_->work, size_, set_->stream,
            "copying the result off the device"));
        !s.ok()) {
      return s;
    }
    return Sync("the result");
  }

  absl::Status CopyToDevice(void* dst, void* then) override {
    if (absl::Status s = Usable(); !s.ok()) return s;
    if (size_ == 0) return absl::OkStatus();
    if (absl::Status s =
            runtime_->CheckPointer(device_, dst, size_, "output pointer");
        !s.ok()) {
      return s;  // the buffer itself is fine
    }
    if (absl::Status s = Check(
            runtime_->CopyAsync(device_, dst, set_->work, size_, set_->stream,
                                "copying the result to the output"));
        !s.ok()) {
      return s;
    }
    if (then != nullptr) return Check(HandOff(*set_, then));
    return Sync("the result");
  }

 private:
  char* Work(const Range& range) const {
    return static_cast<char*>(set_->work) + range.offset;
  }

  absl::Status Usable() const {
    if (healthy_) return absl::OkStatus();
    return absl::FailedPreconditionError(
        absl::StrCat(DeviceRuntime::Name(device_),
                     ": this call's device buffer failed earlier"));
  }

  // Marks the buffer unhealthy when `status` is an error (and the device
  // withdrawn when it faulted); returns it.
  absl::Status Check(absl::Status status) {
    if (!status.ok()) healthy_ = false;
    return pool_->Noted(device_, std::move(status));
  }

  // Waits for everything enqueued on the call's stream.
  absl::Status Sync(absl::string_view what) {
    if (absl::Status s =
            Check(runtime_->Record(device_, set_->read_done, set_->stream));
        !s.ok()) {
      return s;
    }
    return Check(runtime_->Wait(device_, set_->read_done, what));
  }

  // Checks `range` and `data`, picks the next slot, waits until its
  // previous chunk was used, grows it and copies `data` into its pinned
  // host memory.
  absl::Status Stage(const Range& range, absl::string_view data,
                     Slot** slot_out) {
    if (absl::Status s = CheckRange(range, size_, data.size()); !s.ok()) {
      return s;
    }
    if (absl::Status s = Usable(); !s.ok()) return s;
    Slot& slot = set_->slots[next_slot_];
    next_slot_ ^= 1;
    if (absl::Status s =
            Check(runtime_->Wait(device_, slot.done, "a staging slot"));
        !s.ok()) {
      return s;
    }
    if (absl::Status s = Check(
            GrowPinned(*set_, &slot.host, &slot.host_capacity, range.size));
        !s.ok()) {
      return s;
    }
    if (absl::Status s = Check(
            GrowDevice(*set_, &slot.device, &slot.device_capacity, range.size));
        !s.ok()) {
      return s;
    }
    if (!data.empty()) std::memcpy(slot.host, data.data(), data.size());
    *slot_out = &slot;
    return absl::OkStatus();
  }

  DeviceBuffers::Pool* const pool_;  // not owned
  std::unique_ptr<StagingSet> set_;
  DeviceRuntime* const runtime_;  // not owned
  const int device_;
  const ReduceOp op_;
  const DType dtype_;
  const uint64_t size_;
  int next_slot_ = 0;
  bool healthy_ = true;
};

}  // namespace

DeviceBuffers::DeviceBuffers(DeviceRuntime* runtime, int max_idle_sets,
                             uint64_t max_idle_bytes)
    : runtime_(runtime),
      pool_(std::make_unique<Pool>(runtime, max_idle_sets, max_idle_bytes)) {}

DeviceBuffers::~DeviceBuffers() = default;

absl::Status DeviceBuffers::CheckPointer(int device, const void* ptr,
                                         uint64_t bytes,
                                         absl::string_view what) {
  return runtime_->CheckPointer(device, ptr, bytes, what);
}

absl::StatusOr<std::unique_ptr<DeviceReduceBuffer>> DeviceBuffers::FromDevice(
    int device, const CollectiveSpec& spec, const void* input, uint64_t bytes,
    void* after) {
  if (absl::Status s = CheckPointer(device, input, bytes, "input pointer");
      !s.ok()) {
    return s;
  }
  return Make(device, spec, input, bytes, after);
}

absl::StatusOr<std::unique_ptr<DeviceReduceBuffer>> DeviceBuffers::FromHost(
    int device, const CollectiveSpec& spec, absl::string_view input) {
  return Make(device, spec, input.data(), input.size(), /*after=*/nullptr);
}

absl::StatusOr<std::unique_ptr<DeviceReduceBuffer>> DeviceBuffers::Make(
    int device, const CollectiveSpec& spec, const void* input, uint64_t bytes,
    void* after) {
  absl::StatusOr<std::unique_ptr<StagingSet>> set = pool_->Take(device);
  if (!set.ok()) return set.status();
  auto buffer = std::make_unique<StagedReduceBuffer>(
      pool_.get(), *std::move(set), spec, bytes);
  if (absl::Status s = buffer->Load(input, after); !s.ok()) return s;
  return buffer;
}

absl::Status DeviceBuffers::Copy(int device, void* dst, const void* src,
                                 uint64_t bytes, void* after, void* then) {
  absl::StatusOr<std::unique_ptr<StagingSet>> set = pool_->Take(device);
  if (!set.ok()) return set.status();
  StagingSet& staging = **set;
  absl::Status status = WaitOnGpuFor(staging, after);
  if (status.ok()) {
    status =
        runtime_->CopyAsync(device, dst, src, bytes, staging.stream, "copying");
  }
  if (status.ok() && then != nullptr) {
    status = HandOff(staging, then);
  } else if (status.ok()) {
    status = runtime_->Record(device, staging.read_done, staging.stream);
    if (status.ok()) {
      status = runtime_->Wait(device, staging.read_done, "a copy");
    }
  }
  pool_->Give(*std::move(set), status.ok());
  return pool_->Noted(device, std::move(status));
}

absl::Status DeviceBuffers::CopyFromDevice(int device, const void* src,
                                           uint64_t bytes, std::string* out,
                                           void* after) {
  if (absl::Status s = CheckPointer(device, src, bytes, "input pointer");
      !s.ok()) {
    return s;
  }
  out->resize(bytes);
  if (bytes == 0) return absl::OkStatus();
  return Copy(device, out->data(), src, bytes, after, /*then=*/nullptr);
}

absl::Status DeviceBuffers::CopyToDevice(int device, absl::string_view src,
                                         void* dst, void* then) {
  if (absl::Status s = CheckPointer(device, dst, src.size(), "output pointer");
      !s.ok()) {
    return s;
  }
  if (src.empty()) return absl::OkStatus();
  return Copy(device, dst, src.data(), src.size(), /*after=*/nullptr, then);
}

absl::Status DeviceBuffers::Withdrawn(int device) const {
  absl::MutexLock lock(&pool_->mu);
  return pool_->WithdrawnLocked(device);
}

std::vector<Device> DeviceBuffers::WithdrawnDevices() const {
  std::vector<Device> withdrawn;
  absl::MutexLock lock(&pool_->mu);
  for (const auto& [device, fault] : pool_->faults) {
    Device gpu;
    gpu.kind = DeviceKind::kCuda;
    gpu.index = device;
    withdrawn.push_back(gpu);
  }
  return withdrawn;
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
