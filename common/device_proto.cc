#include "common/device_proto.h"

namespace chorus {

Device DeviceFromProto(const v1::Device& proto) {
  Device device;
  device.kind = static_cast<DeviceKind>(proto.kind());
  device.index = proto.index();
  device.other_kind = proto.other_kind();
  device.model = proto.model();
  device.memory_bytes = proto.memory_bytes();
  device.compute_capability = proto.compute_capability();
  return device;
}

v1::Device DeviceToProto(const Device& device) {
  v1::Device proto;
  proto.set_kind(static_cast<v1::DeviceKind>(device.kind));
  proto.set_index(device.index);
  proto.set_other_kind(device.other_kind);
  proto.set_model(device.model);
  proto.set_memory_bytes(device.memory_bytes);
  proto.set_compute_capability(device.compute_capability);
  return proto;
}

}  // namespace chorus
