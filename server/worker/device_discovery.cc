#include "server/worker/device_discovery.h"

#include <unistd.h>

#include "server/worker/cuda_probe.h"

namespace chorus {

namespace {

// The CPU, with this machine's memory.
Device Cpu() {
  Device cpu;
  cpu.kind = DeviceKind::kCpu;
  cpu.model = "cpu";
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGE_SIZE);
  if (pages > 0 && page_size > 0) {
    cpu.memory_bytes = static_cast<uint64_t>(pages) * page_size;
  }
  return cpu;
}

}  // namespace

DiscoveredDevices DiscoverDevices() {
  DiscoveredDevices discovered;
  discovered.devices.push_back(Cpu());

  CudaProbeResult cuda = ProbeCuda();
  discovered.support.cuda_built = cuda.built_with_cuda;
  discovered.support.cuda_device_count = static_cast<int>(cuda.gpus.size());
  discovered.support.cuda_unavailable_reason = cuda.unavailable_reason;
  discovered.support.cuda_refused = cuda.refused;
  for (Device& gpu : cuda.gpus) {
    if (cuda.refused.count(gpu.index) == 0) {
      discovered.devices.push_back(std::move(gpu));
    }
  }
  return discovered;
}

DiscoveredDevices DiscoverEmulated(const std::vector<Device>& gpus) {
  DiscoveredDevices discovered;
  discovered.devices.push_back(Cpu());
  discovered.devices.insert(discovered.devices.end(), gpus.begin(), gpus.end());
  discovered.support.cuda_built = true;
  discovered.support.cuda_device_count = static_cast<int>(gpus.size());
  return discovered;
}

absl::StatusOr<std::vector<Device>> SelectDevices(
    const std::vector<Device>& requested, const DiscoveredDevices& discovered) {
  if (requested.empty()) return discovered.devices;
  std::vector<Device> selected;
  for (const Device& want : requested) {
    absl::Status supported = CheckDeviceSupported(want, discovered.support);
    if (!supported.ok()) return supported;
    Device device = want;
    for (const Device& have : discovered.devices) {
      if (SameDevice(have, want)) device = have;
    }
    selected.push_back(device);
  }
  return selected;
}

}  // namespace chorus
