// Device discovery: what a worker can serve. The CPU is always there; CUDA
// GPUs are found through the CUDA runtime when Chorus is built with CUDA.
// "No driver" or "no device" means zero GPUs, never a crash.
//
// Pure functions; thread-safe.
#ifndef CHORUS_SERVER_WORKER_DEVICE_DISCOVERY_H_
#define CHORUS_SERVER_WORKER_DEVICE_DISCOVERY_H_

#include <vector>

#include "absl/status/status.h"
#include "common/device.h"

namespace chorus {

struct DiscoveredDevices {
  // The CPU first, then Cuda(0), Cuda(1), ... with model, memory and compute
  // capability filled in; a GPU this build has no kernels for is left out
  // (support.cuda_refused says why).
  std::vector<Device> devices;
  DeviceSupport support;
};

// Returns the devices this process can serve.
DiscoveredDevices DiscoverDevices();

// DiscoverDevices() with `gpus` (an emulation's, for tests) as the GPUs.
DiscoveredDevices DiscoverEmulated(const std::vector<Device>& gpus);

// Returns the devices a worker should register: `requested` when not empty
// (each checked against `discovered`, with the descriptive fields of the
// matching discovered device copied in), else every discovered device.
// Returns UNIMPLEMENTED (the device refusal message) for a requested device
// this worker cannot serve.
absl::StatusOr<std::vector<Device>> SelectDevices(
    const std::vector<Device>& requested, const DiscoveredDevices& discovered);

}  // namespace chorus

#endif  // CHORUS_SERVER_WORKER_DEVICE_DISCOVERY_H_
