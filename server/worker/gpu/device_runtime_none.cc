// The DeviceRuntime of a build without CUDA: every operation refuses the
// device.
#include "common/device.h"
#include "server/worker/gpu/device_runtime.h"
#include "server/worker/gpu/nccl_runtime.h"

namespace chorus {
namespace {

absl::Status Refused(int device) {
  Device cuda;
  cuda.kind = DeviceKind::kCuda;
  cuda.index = device;
  return UnsupportedDeviceError(cuda, "this worker was built without CUDA");
}

class NoDeviceRuntime final : public DeviceRuntime {
 public:
  NcclRuntime* Nccl() override { return BuiltInNcclRuntime(); }
  absl::Status EnqueueHost(int device, Stream, std::function<void()>) override {
    return Refused(device);
  }
  absl::StatusOr<Stream> NewStream(int device) override {
    return Refused(device);
  }
  void DeleteStream(int, Stream) override {}
  absl::StatusOr<Event> NewEvent(int device) override {
    return Refused(device);
  }
  void DeleteEvent(int, Event) override {}
  absl::StatusOr<void*> AllocDevice(int device, uint64_t) override {
    return Refused(device);
  }
  void FreeDevice(int, void*) override {}
  absl::StatusOr<char*> AllocPinned(int device, uint64_t) override {
    return Refused(device);
  }
  void FreePinned(int, char*) override {}
  absl::Status CopyAsync(int device, void*, const void*, uint64_t, Stream,
                         absl::string_view) override {
    return Refused(device);
  }
  absl::Status Reduce(int device, ReduceOp, DType, void*, const void*,
                      const void*, size_t, Stream) override {
    return Refused(device);
  }
  absl::Status FinalizeAvg(int device, DType, void*, size_t, int,
                           Stream) override {
    return Refused(device);
  }
  absl::Status Record(int device, Event, Stream) override {
    return Refused(device);
  }
  absl::Status StreamWait(int device, Stream, Event) override {
    return Refused(device);
  }
  absl::Status Wait(int device, Event, absl::string_view) override {
    return Refused(device);
  }
  absl::Status CheckPointer(int device, const void*, uint64_t,
                            absl::string_view) override {
    return Refused(device);
  }
};

}  // namespace

DeviceRuntime* BuiltInDeviceRuntime() {
  static NoDeviceRuntime* const runtime = new NoDeviceRuntime();
  return runtime;
}

}  // namespace chorus
