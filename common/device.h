// Devices as Chorus sees them: a kind and an index, with one canonical name
// ("Cpu", "Cuda(0)", "Vulkan(0)", "Npu(2)") that every message prints, and the
// one place that decides whether a device can take part in distributed
// operations and words the refusal.
//
// Plain values; every function here is thread-compatible and pure.
#ifndef CHORUS_COMMON_DEVICE_H_
#define CHORUS_COMMON_DEVICE_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "chorus/types.h"

namespace chorus {

// Two devices are the same device when kind, index and other_kind match.
bool SameDevice(const Device& a, const Device& b);

// Returns the canonical name: "Cpu", "Cuda(0)", "Rocm(1)", "Vulkan(0)",
// "Metal(0)", "Wgpu(0)", "Tpu(3)", or "<other_kind>(<index>)".
std::string CanonicalName(const Device& device);

// The fixed prefix every refusal starts with, followed by the device name.
inline constexpr absl::string_view kUnsupportedDevicePrefix =
    "Distributed operations are not supported for device ";

// Returns UNIMPLEMENTED with the message
// "Distributed operations are not supported for device <name>" followed by
// ": <reason>" when reason is not empty.
absl::Status UnsupportedDeviceError(const Device& device,
                                    absl::string_view reason = "");

// True when `status` is a refusal made by UnsupportedDeviceError.
bool IsDeviceRefusal(const absl::Status& status);

// Checks the shape of a device: a known kind, a non-negative index, CPU at
// index 0, other_kind set exactly when kind is kOther. Returns OK or
// INVALID_ARGUMENT.
absl::Status ValidateDevice(const Device& device);

// What a worker can serve. cuda_device_count < 0 means "unknown here" (the
// coordinator does not know how many GPUs a worker has, only the worker does).
struct DeviceSupport {
  bool cuda_built = false;
  int cuda_device_count = -1;
  // Why no CUDA device is usable, e.g. "no CUDA driver"; may be empty.
  std::string cuda_unavailable_reason;
  // GPUs that exist but cannot be served, by index: why (e.g. the build has
  // no kernels for their compute capability).
  std::map<int, std::string> cuda_refused;
};

// Returns OK when `device` can take part in distributed operations under
// `support`: Cpu always, Cuda(n) when CUDA is built in and GPU n exists and
// is not refused. Otherwise UNIMPLEMENTED via UnsupportedDeviceError, with
// the reason (built without CUDA, index out of range, the refusal's reason)
// after the fixed prefix. Does not check
// the shape; call ValidateDevice first.
absl::Status CheckDeviceSupported(const Device& device,
                                  const DeviceSupport& support);

// Parses one device spec: "cpu", "cuda:0", "vulkan:1", "npu:2" (a kind the
// protocol does not know keeps its spelling). Kind names are
// case-insensitive; the index defaults to 0. Returns INVALID_ARGUMENT for an
// empty kind or a malformed or negative index.
absl::StatusOr<Device> ParseDeviceSpec(absl::string_view spec);

// Parses a comma-separated list of device specs. Returns INVALID_ARGUMENT
// for a malformed entry, an empty list or a device listed twice.
absl::StatusOr<std::vector<Device>> ParseDeviceList(absl::string_view list);

// Returns INVALID_ARGUMENT naming the first device that appears twice.
absl::Status CheckNoDuplicates(const std::vector<Device>& devices);

}  // namespace chorus

#endif  // CHORUS_COMMON_DEVICE_H_
