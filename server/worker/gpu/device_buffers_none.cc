// DeviceBuffers for a worker built without CUDA: every call is refused.
#include "common/device.h"
#include "server/worker/gpu/device_buffers.h"

namespace chorus {
namespace {

absl::Status Refused(int device) {
  Device cuda;
  cuda.kind = DeviceKind::kCuda;
  cuda.index = device;
  return UnsupportedDeviceError(cuda, "this worker was built without CUDA");
}

}  // namespace

struct DeviceBuffers::Pool {};

DeviceBuffers::DeviceBuffers(int, uint64_t) {}
DeviceBuffers::~DeviceBuffers() = default;

absl::StatusOr<std::unique_ptr<DeviceReduceBuffer>> DeviceBuffers::FromHost(
    int device, const CollectiveSpec&, absl::string_view) {
  return Refused(device);
}

absl::StatusOr<std::unique_ptr<DeviceReduceBuffer>> DeviceBuffers::FromDevice(
    int device, const CollectiveSpec&, const void*, uint64_t) {
  return Refused(device);
}

absl::Status DeviceBuffers::CopyFromDevice(int device, const void*, uint64_t,
                                           std::string*) {
  return Refused(device);
}

absl::Status DeviceBuffers::CopyToDevice(int device, absl::string_view, void*) {
  return Refused(device);
}

absl::Status DeviceBuffers::CheckPointer(int device, const void*, uint64_t,
                                         absl::string_view) {
  return Refused(device);
}

int DeviceBuffers::idle_sets() const { return 0; }

}  // namespace chorus
