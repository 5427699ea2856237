#include "common/device.h"

#include <cctype>
#include <string>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/status_detail.h"

namespace chorus {
namespace {

struct KindName {
  DeviceKind kind;
  absl::string_view display;  // as in canonical names
};

constexpr KindName kKindNames[] = {
    {DeviceKind::kCpu, "Cpu"},     {DeviceKind::kCuda, "Cuda"},
    {DeviceKind::kRocm, "Rocm"},   {DeviceKind::kVulkan, "Vulkan"},
    {DeviceKind::kMetal, "Metal"}, {DeviceKind::kWgpu, "Wgpu"},
    {DeviceKind::kTpu, "Tpu"},
};

absl::string_view KindDisplayName(DeviceKind kind) {
  for (const KindName& k : kKindNames) {
    if (k.kind == kind) return k.display;
  }
  return "";
}

bool IsKnownKind(DeviceKind kind) {
  return kind == DeviceKind::kOther || !KindDisplayName(kind).empty();
}

}  // namespace

bool SameDevice(const Device& a, const Device& b) {
  return a.kind == b.kind && a.index == b.index && a.other_kind == b.other_kind;
}

std::string CanonicalName(const Device& device) {
  if (device.kind == DeviceKind::kCpu) return "Cpu";
  absl::string_view kind = device.kind == DeviceKind::kOther
                               ? absl::string_view(device.other_kind)
                               : KindDisplayName(device.kind);
  if (kind.empty()) {
    return absl::StrCat("UnknownKind", static_cast<int>(device.kind), "(",
                        device.index, ")");
  }
  return absl::StrCat(kind, "(", device.index, ")");
}

absl::Status UnsupportedDeviceError(const Device& device,
                                    absl::string_view reason) {
  std::string message =
      absl::StrCat(kUnsupportedDevicePrefix, CanonicalName(device));
  if (!reason.empty()) absl::StrAppend(&message, ": ", reason);
  v1::ErrorDetail detail = MakeErrorDetail("DEVICE_UNSUPPORTED", "", 0, 0);
  detail.set_device(CanonicalName(device));
  return WithErrorDetail(absl::UnimplementedError(message), detail);
}

bool IsDeviceRefusal(const absl::Status& status) {
  return absl::IsUnimplemented(status) &&
         absl::StartsWith(status.message(), kUnsupportedDevicePrefix);
}

absl::Status ValidateDevice(const Device& device) {
  if (!IsKnownKind(device.kind)) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown device kind ", static_cast<int>(device.kind)));
  }
  if (device.kind == DeviceKind::kOther) {
    if (device.other_kind.empty()) {
      return absl::InvalidArgumentError(
          "device kind OTHER needs other_kind to name the kind");
    }
  } else if (!device.other_kind.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("other_kind \"", device.other_kind,
                     "\" is only allowed with device kind OTHER"));
  }
  if (device.index < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("device index must not be negative, got ", device.index));
  }
  if (device.kind == DeviceKind::kCpu && device.index != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("the CPU device has index 0, got ", device.index));
  }
  return absl::OkStatus();
}

absl::Status CheckDeviceSupported(const Device& device,
                                  const DeviceSupport& support) {
  switch (device.kind) {
    case DeviceKind::kCpu:
      return absl::OkStatus();
    case DeviceKind::kCuda:
      if (!support.cuda_built) {
        return UnsupportedDeviceError(device,
                                      "this worker was built without CUDA");
      }
      if (support.cuda_device_count >= 0 &&
          device.index >= support.cuda_device_count) {
        std::string reason = absl::StrCat(
            "this worker has ", support.cuda_device_count, " CUDA device",
            support.cuda_device_count == 1 ? "" : "s");
        if (!support.cuda_unavailable_reason.empty()) {
          absl::StrAppend(&reason, " (", support.cuda_unavailable_reason, ")");
        }
        return UnsupportedDeviceError(device, reason);
      }
      if (auto refused = support.cuda_refused.find(device.index);
          refused != support.cuda_refused.end()) {
        return UnsupportedDeviceError(device, refused->second);
      }
      return absl::OkStatus();
    default:
      return UnsupportedDeviceError(device);
  }
}

absl::StatusOr<Device> ParseDeviceSpec(absl::string_view spec) {
  spec = absl::StripAsciiWhitespace(spec);
  std::pair<absl::string_view, absl::string_view> parts =
      absl::StrSplit(spec, absl::MaxSplits(':', 1));
  absl::string_view kind_text = parts.first;
  if (kind_text.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("device spec \"", spec, "\" has no kind"));
  }
  Device device;
  std::string lower = absl::AsciiStrToLower(kind_text);
  device.kind = DeviceKind::kOther;
  for (const KindName& k : kKindNames) {
    if (absl::AsciiStrToLower(k.display) == lower) device.kind = k.kind;
  }
  if (device.kind == DeviceKind::kOther) {
    for (char c : kind_text) {
      if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_') {
        return absl::InvalidArgumentError(absl::StrCat(
            "device spec \"", spec, "\" has an invalid kind name"));
      }
    }
    device.other_kind = std::string(kind_text);
  }
  if (spec.find(':') != absl::string_view::npos) {
    if (!absl::SimpleAtoi(parts.second, &device.index) || device.index < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "device spec \"", spec, "\" needs a non-negative index after ':'"));
    }
  }
  absl::Status valid = ValidateDevice(device);
  if (!valid.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("device spec \"", spec, "\": ", valid.message()));
  }
  return device;
}

absl::Status CheckNoDuplicates(const std::vector<Device>& devices) {
  absl::flat_hash_set<std::string> seen;
  for (const Device& device : devices) {
    std::string name = CanonicalName(device);
    if (!seen.insert(name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("device ", name, " is listed twice"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<Device>> ParseDeviceList(absl::string_view list) {
  std::vector<Device> devices;
  for (absl::string_view spec :
       absl::StrSplit(list, ',', absl::SkipWhitespace())) {
    absl::StatusOr<Device> device = ParseDeviceSpec(spec);
    if (!device.ok()) return device.status();
    devices.push_back(*std::move(device));
  }
  if (devices.empty()) {
    return absl::InvalidArgumentError("the device list is empty");
  }
  absl::Status unique = CheckNoDuplicates(devices);
  if (!unique.ok()) return unique;
  return devices;
}

}  // namespace chorus
