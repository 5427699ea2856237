#include "server/worker/gpu/emulated_device_runtime.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <iterator>
#include <memory>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "server/reduce/cpu/cpu_reduce.h"
#include "server/worker/gpu/emulated_nccl_runtime.h"

namespace chorus {
namespace {

// A stream: a thread that runs its queue in order.
class EmulatedStream {
 public:
  EmulatedStream() : thread_([this] { Run(); }) {}

  // Runs what is queued, then stops.
  ~EmulatedStream() {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
    }
    thread_.join();
  }

  std::atomic<int> records{0};
  std::atomic<int> waits{0};

  void Enqueue(std::function<void()> work) {
    absl::MutexLock lock(&mu_);
    queue_.push_back(std::move(work));
  }

 private:
  void Run() {
    while (true) {
      std::function<void()> work;
      {
        absl::MutexLock lock(&mu_);
        mu_.Await(absl::Condition(
            +[](EmulatedStream* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu_) {
              return s->stopping_ || !s->queue_.empty();
            },
            this));
        if (queue_.empty()) return;  // stopping, and everything ran
        work = std::move(queue_.front());
        queue_.pop_front();
      }
      work();
    }
  }

  absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

// An event: how many times it was recorded, and how far its stream got.
struct EmulatedEvent {
  absl::Mutex mu;
  uint64_t recorded ABSL_GUARDED_BY(mu) = 0;
  uint64_t reached ABSL_GUARDED_BY(mu) = 0;
};

// Blocks until `event`'s stream reached its `mark`-th record.
void WaitUntilReached(EmulatedEvent& event, uint64_t mark) {
  absl::MutexLock lock(&event.mu);
  std::pair<EmulatedEvent*, uint64_t> until(&event, mark);
  event.mu.Await(absl::Condition(
      +[](std::pair<EmulatedEvent*, uint64_t>* wait)
           ABSL_EXCLUSIVE_LOCKS_REQUIRED(wait->first->mu) {
             return wait->first->reached >= wait->second;
           },
      &until));
}

EmulatedStream* AsEmulated(DeviceRuntime::Stream stream) {
  return reinterpret_cast<EmulatedStream*>(stream);
}
// An event's handle holds it shared: work a stream still runs may mark it
// after its owner deleted the handle.
using SharedEvent = std::shared_ptr<EmulatedEvent>;
const SharedEvent& AsEmulated(DeviceRuntime::Event event) {
  return *reinterpret_cast<SharedEvent*>(event);
}

// Whether `at` lies in one of `ranges` (start -> size).
bool Within(const std::map<uintptr_t, uint64_t>& ranges, uintptr_t at) {
  auto it = ranges.upper_bound(at);
  return it != ranges.begin() &&
         at < std::prev(it)->first + std::prev(it)->second;
}

// Memory aligned as cudaMalloc's (256 bytes), zero-filled.
char* AlignedBytes(uint64_t bytes) {
  void* memory = nullptr;
  if (posix_memalign(&memory, 256, bytes == 0 ? 1 : bytes) != 0) {
    return nullptr;
  }
  std::memset(memory, 0, bytes);
  return static_cast<char*>(memory);
}

}  // namespace

EmulatedDeviceRuntime::EmulatedDeviceRuntime(int devices, uint64_t memory_bytes)
    : devices_(devices),
      nccl_(std::make_unique<EmulatedNcclRuntime>(this)),
      memory_bytes_(memory_bytes),
      gpus_(devices) {}

EmulatedDeviceRuntime::~EmulatedDeviceRuntime() {
  absl::MutexLock lock(&mu_);
  for (Gpu& gpu : gpus_) {
    for (const auto& [start, size] : gpu.allocations) {
      free(reinterpret_cast<void*>(start));
    }
  }
}

std::optional<std::vector<Device>> EmulatedDeviceRuntime::Gpus() const {
  std::vector<Device> devices;
  for (int i = 0; i < devices_; ++i) {
    Device gpu;
    gpu.kind = DeviceKind::kCuda;
    gpu.index = i;
    gpu.model = "emulated GPU";
    gpu.memory_bytes = memory_bytes_;
    devices.push_back(gpu);
  }
  return devices;
}

void EmulatedDeviceRuntime::Fault(int device, const std::string& why) {
  absl::MutexLock lock(&mu_);
  if (device >= 0 && device < devices_) gpus_[device].fault = why;
}

void EmulatedDeviceRuntime::FaultAtKernel(int device, int kernels,
                                          const std::string& why) {
  absl::MutexLock lock(&mu_);
  if (device < 0 || device >= devices_) return;
  gpus_[device].kernels_until_fault = kernels;
  gpus_[device].planned_fault = why;
}

NcclRuntime* EmulatedDeviceRuntime::Nccl() { return nccl_.get(); }

absl::Status EmulatedDeviceRuntime::EnqueueHost(int device, Stream stream,
                                                std::function<void()> fn) {
  if (absl::Status s = Usable(device, "enqueueing a host function"); !s.ok()) {
    return s;
  }
  AsEmulated(stream)->Enqueue(std::move(fn));
  return absl::OkStatus();
}

void EmulatedDeviceRuntime::EnqueueKernel(int device, Stream stream,
                                          std::function<void()> kernel) {
  AsEmulated(stream)->Enqueue([this, device, kernel = std::move(kernel)] {
    if (KernelMayRun(device)) kernel();
  });
}

std::function<void()> EmulatedDeviceRuntime::Hold(Stream stream) {
  auto released = std::make_shared<absl::Notification>();
  AsEmulated(stream)->Enqueue([released] { released->WaitForNotification(); });
  return [released] { released->Notify(); };
}

std::function<void()> EmulatedDeviceRuntime::HoldCopiesTo(const void* dst) {
  auto released = std::make_shared<absl::Notification>();
  {
    absl::MutexLock lock(&mu_);
    held_copies_[dst] = released;
  }
  return [this, dst, released] {
    {
      absl::MutexLock lock(&mu_);
      held_copies_.erase(dst);
    }
    released->Notify();
  };
}

int EmulatedDeviceRuntime::RecordedOn(Stream stream) const {
  return AsEmulated(stream)->records.load();
}

int EmulatedDeviceRuntime::WaitsOn(Stream stream) const {
  return AsEmulated(stream)->waits.load();
}

uint64_t EmulatedDeviceRuntime::AllocatedBytes(int device) const {
  absl::MutexLock lock(&mu_);
  return device >= 0 && device < devices_ ? gpus_[device].allocated : 0;
}

absl::Status EmulatedDeviceRuntime::UsableLocked(
    int device, absl::string_view doing) const {
  if (device < 0 || device >= devices_) {
    return absl::InvalidArgumentError(absl::StrCat(Name(device), ": ", doing,
                                                   ": no such device (",
                                                   devices_, " emulated)"));
  }
  if (!gpus_[device].fault.empty()) {
    return absl::InternalError(
        absl::StrCat(Name(device), ": ", doing,
                     ": device fault (emulated): ", gpus_[device].fault));
  }
  return absl::OkStatus();
}

absl::Status EmulatedDeviceRuntime::Usable(int device,
                                           absl::string_view doing) const {
  absl::MutexLock lock(&mu_);
  return UsableLocked(device, doing);
}

bool EmulatedDeviceRuntime::Faulted(int device) const {
  absl::MutexLock lock(&mu_);
  return !gpus_[device].fault.empty();
}

bool EmulatedDeviceRuntime::Pageable(const void* ptr) const {
  const uintptr_t at = reinterpret_cast<uintptr_t>(ptr);
  absl::MutexLock lock(&mu_);
  if (Within(pinned_, at)) return false;
  for (const Gpu& gpu : gpus_) {
    if (Within(gpu.allocations, at)) return false;
  }
  return true;
}

bool EmulatedDeviceRuntime::KernelMayRun(int device) {
  absl::MutexLock lock(&mu_);
  Gpu& gpu = gpus_[device];
  if (!gpu.fault.empty()) return false;
  if (gpu.kernels_until_fault > 0 && --gpu.kernels_until_fault == 0) {
    gpu.fault = gpu.planned_fault;
    return false;
  }
  return true;
}

absl::StatusOr<DeviceRuntime::Stream> EmulatedDeviceRuntime::NewStream(
    int device) {
  if (absl::Status s = Usable(device, "creating a stream"); !s.ok()) return s;
  return reinterpret_cast<Stream>(new EmulatedStream());
}

void EmulatedDeviceRuntime::DeleteStream(int, Stream stream) {
  delete AsEmulated(stream);
}

absl::StatusOr<DeviceRuntime::Event> EmulatedDeviceRuntime::NewEvent(
    int device) {
  if (absl::Status s = Usable(device, "creating an event"); !s.ok()) return s;
  return reinterpret_cast<Event>(
      new SharedEvent(std::make_shared<EmulatedEvent>()));
}

void EmulatedDeviceRuntime::DeleteEvent(int, Event event) {
  delete reinterpret_cast<SharedEvent*>(event);
}

absl::StatusOr<void*> EmulatedDeviceRuntime::AllocDevice(int device,
                                                         uint64_t bytes) {
  const std::string doing =
      absl::StrCat("allocating ", bytes, " bytes of memory");
  absl::MutexLock lock(&mu_);
  if (absl::Status s = UsableLocked(device, doing); !s.ok()) return s;
  Gpu& gpu = gpus_[device];
  char* memory =
      bytes > memory_bytes_ - gpu.allocated ? nullptr : AlignedBytes(bytes);
  if (memory == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat(Name(device), ": ", doing, ": out of memory (",
                     gpu.allocated, " of ", memory_bytes_, " bytes in use)"));
  }
  gpu.allocations[reinterpret_cast<uintptr_t>(memory)] = bytes;
  gpu.allocated += bytes;
  return static_cast<void*>(memory);
}

void EmulatedDeviceRuntime::FreeDevice(int device, void* memory) {
  if (memory == nullptr) return;
  absl::MutexLock lock(&mu_);
  if (device < 0 || device >= devices_) return;
  Gpu& gpu = gpus_[device];
  auto it = gpu.allocations.find(reinterpret_cast<uintptr_t>(memory));
  if (it == gpu.allocations.end()) return;
  gpu.allocated -= it->second;
  gpu.allocations.erase(it);
  free(memory);
}

absl::StatusOr<char*> EmulatedDeviceRuntime::AllocPinned(int device,
                                                         uint64_t bytes) {
  if (absl::Status s = Usable(device, "allocating pinned host memory");
      !s.ok()) {
    return s;
  }
  char* memory = AlignedBytes(bytes);
  if (memory == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat(
        Name(device), ": allocating ", bytes, " bytes of pinned host memory"));
  }
  absl::MutexLock lock(&mu_);
  pinned_[reinterpret_cast<uintptr_t>(memory)] = bytes == 0 ? 1 : bytes;
  return memory;
}

void EmulatedDeviceRuntime::FreePinned(int, char* memory) {
  if (memory == nullptr) return;
  {
    absl::MutexLock lock(&mu_);
    pinned_.erase(reinterpret_cast<uintptr_t>(memory));
  }
  free(memory);
}

absl::Status EmulatedDeviceRuntime::CopyAsync(int device, void* dst,
                                              const void* src, uint64_t bytes,
                                              Stream stream,
                                              absl::string_view doing) {
  if (absl::Status s = Usable(device, doing); !s.ok()) return s;
  if (bytes == 0) return absl::OkStatus();
  std::shared_ptr<absl::Notification> held;
  {
    absl::MutexLock lock(&mu_);
    auto it = held_copies_.find(dst);
    if (it != held_copies_.end()) held = it->second;
  }
  if (held != nullptr) {
    AsEmulated(stream)->Enqueue([held] { held->WaitForNotification(); });
  }
  if (Pageable(dst)) {
    // Into pageable memory: done when this returns (after the stream's
    // earlier work).
    auto reached = std::make_shared<absl::Notification>();
    AsEmulated(stream)->Enqueue([reached] { reached->Notify(); });
    reached->WaitForNotification();
    if (absl::Status s = Usable(device, doing); !s.ok()) return s;
    std::memcpy(dst, src, bytes);
    return absl::OkStatus();
  }
  if (Pageable(src)) {
    // From pageable memory: taken now (CUDA stages it before returning).
    auto taken =
        std::make_shared<std::string>(static_cast<const char*>(src), bytes);
    AsEmulated(stream)->Enqueue([this, device, dst, taken] {
      if (!Faulted(device)) std::memcpy(dst, taken->data(), taken->size());
    });
    return absl::OkStatus();
  }
  AsEmulated(stream)->Enqueue([this, device, dst, src, bytes] {
    if (!Faulted(device)) std::memcpy(dst, src, bytes);
  });
  return absl::OkStatus();
}

absl::Status EmulatedDeviceRuntime::Reduce(int device, ReduceOp op, DType dtype,
                                           void* dst, const void* a,
                                           const void* b, size_t count,
                                           Stream stream) {
  const uint64_t bytes = count * DTypeSize(dtype);
  for (const void* operand : {static_cast<const void*>(dst), a, b}) {
    if (absl::Status s = CheckPointer(device, operand, bytes, "kernel operand");
        !s.ok()) {
      return s;
    }
  }
  AsEmulated(stream)->Enqueue([this, device, op, dtype, dst, a, b, count] {
    if (KernelMayRun(device)) {
      cpu_reduce::Reduce(op, dtype, dst, a, b, count).IgnoreError();
    }
  });
  return absl::OkStatus();
}

absl::Status EmulatedDeviceRuntime::FinalizeAvg(int device, DType dtype,
                                                void* data, size_t count,
                                                int world_size, Stream stream) {
  if (absl::Status s = CheckPointer(device, data, count * DTypeSize(dtype),
                                    "kernel operand");
      !s.ok()) {
    return s;
  }
  if (world_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(Name(device), ": avg over ", world_size, " ranks"));
  }
  AsEmulated(stream)->Enqueue([this, device, dtype, data, count, world_size] {
    if (KernelMayRun(device)) {
      cpu_reduce::FinalizeAvg(dtype, data, count, world_size).IgnoreError();
    }
  });
  return absl::OkStatus();
}

absl::Status EmulatedDeviceRuntime::Record(int device, Event event,
                                           Stream stream) {
  if (absl::Status s = Usable(device, "recording an event"); !s.ok()) {
    return s;
  }
  SharedEvent recorded = AsEmulated(event);
  ++AsEmulated(stream)->records;
  uint64_t mark = 0;
  {
    absl::MutexLock lock(&recorded->mu);
    mark = ++recorded->recorded;
  }
  AsEmulated(stream)->Enqueue([recorded, mark] {
    absl::MutexLock lock(&recorded->mu);
    recorded->reached = std::max(recorded->reached, mark);
  });
  return absl::OkStatus();
}

absl::Status EmulatedDeviceRuntime::StreamWait(int device, Stream stream,
                                               Event event) {
  if (absl::Status s = Usable(device, "ordering a stream after an event");
      !s.ok()) {
    return s;
  }
  SharedEvent awaited = AsEmulated(event);
  ++AsEmulated(stream)->waits;
  uint64_t mark = 0;
  {
    absl::MutexLock lock(&awaited->mu);
    mark = awaited->recorded;
  }
  // The stream's thread waits, as a GPU's stream would; the caller does not.
  AsEmulated(stream)->Enqueue(
      [awaited, mark] { WaitUntilReached(*awaited, mark); });
  return absl::OkStatus();
}

absl::Status EmulatedDeviceRuntime::Wait(int device, Event event,
                                         absl::string_view what) {
  EmulatedEvent& waited = *AsEmulated(event);
  uint64_t mark = 0;
  {
    absl::MutexLock lock(&waited.mu);
    mark = waited.recorded;
  }
  WaitUntilReached(waited, mark);
  return Usable(device, absl::StrCat("waiting for ", what));
}

absl::Status EmulatedDeviceRuntime::CheckPointer(int device, const void* ptr,
                                                 uint64_t bytes,
                                                 absl::string_view what) {
  if (bytes == 0) return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  if (absl::Status s =
          UsableLocked(device, absl::StrCat("looking up the ", what));
      !s.ok()) {
    return s;
  }
  const Gpu& gpu = gpus_[device];
  const uintptr_t at = reinterpret_cast<uintptr_t>(ptr);
  auto it = gpu.allocations.upper_bound(at);
  const std::string named =
      absl::StrCat(Name(device), ": the ", what, " 0x", absl::Hex(at));
  if (it == gpu.allocations.begin() ||
      at >= std::prev(it)->first + std::prev(it)->second) {
    return absl::InvalidArgumentError(
        absl::StrCat(named, " is not memory of this GPU"));
  }
  --it;
  const uint64_t left = it->first + it->second - at;
  if (bytes > left) {
    return absl::InvalidArgumentError(
        absl::StrCat(named, " has ", left,
                     " bytes of this GPU's memory "
                     "behind it, not ",
                     bytes));
  }
  return absl::OkStatus();
}

}  // namespace chorus
