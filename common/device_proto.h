// Conversion between chorus::Device and the chorus.v1.Device message.
//
// Pure functions; thread-safe.
#ifndef CHORUS_COMMON_DEVICE_PROTO_H_
#define CHORUS_COMMON_DEVICE_PROTO_H_

#include "chorus/v1/types.pb.h"
#include "common/device.h"

namespace chorus {

// Copies every field. An enum value the protocol does not know is kept as
// its number, so ValidateDevice can refuse it.
Device DeviceFromProto(const v1::Device& proto);
v1::Device DeviceToProto(const Device& device);

}  // namespace chorus

#endif  // CHORUS_COMMON_DEVICE_PROTO_H_
