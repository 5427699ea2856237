"""The user-facing names of the protos' enums and of devices.

Every table here is read from the generated descriptors of
proto/chorus/v1/types.proto, so a value added there is known here without a
copy to keep in step: an enum value's name less its prefix, in lower case,
is what a user passes ("all_reduce", "sum", "f32", "ring", "cuda"). Device
names follow common/device.cc: the canonical name of a kind is its
name capitalized ("Cuda(0)"), the CPU is "Cpu", and a kind the protocol
does not know is DEVICE_KIND_OTHER with the kind string as given ("Npu(2)").
"""

from typing import Dict, Union

from google.protobuf.descriptor import EnumDescriptor

from chorus.errors import InvalidArgument
from chorus.v1 import types_pb2

__all__ = ["KINDS", "OPS", "DTYPES", "ALGORITHMS", "ALGORITHM_NAMES",
           "DEVICE_KINDS", "parse_device", "canonical_name"]


def _lower_names(enum: EnumDescriptor, prefix: str) -> Dict[str, int]:
    """{name less `prefix`, lower case: number} of `enum`'s values, in
    declaration order, without its UNSPECIFIED value (or OTHER).
    """
    names: Dict[str, int] = {}
    for value in enum.values:
        name = value.name[len(prefix):].lower()
        if name not in ("unspecified", "other"):
            names[name] = value.number
    return names


KINDS: Dict[str, int] = _lower_names(
    types_pb2.CollectiveKind.DESCRIPTOR, "COLLECTIVE_KIND_")
"""Collective kind name ("all_reduce") -> chorus.v1.CollectiveKind."""

OPS: Dict[str, int] = _lower_names(types_pb2.ReduceOp.DESCRIPTOR,
                                   "REDUCE_OP_")
"""Reduce op name ("sum") -> chorus.v1.ReduceOp."""

DTYPES: Dict[str, int] = _lower_names(types_pb2.DType.DESCRIPTOR, "DTYPE_")
"""Element type name ("f32") -> chorus.v1.DType."""

ALGORITHM_NAMES: Dict[int, str] = {
    number: name for name, number in _lower_names(
        types_pb2.Algorithm.DESCRIPTOR, "ALGORITHM_").items()}
"""chorus.v1.Algorithm -> the name of the plan a call reports ("ring")."""
ALGORITHM_NAMES[types_pb2.ALGORITHM_UNSPECIFIED] = "auto"

# The protos name a tree plan that no worker runs (server/worker/algorithms
# has none, and no planner picks it), and the leader plan, which a group
# formed with leader calls takes for its small calls: a call forces neither.
_NOT_FORCEABLE = ("tree", "leader")

ALGORITHMS: Dict[str, int] = {"auto": types_pb2.ALGORITHM_UNSPECIFIED}
"""Algorithm name a call may force ("auto", "ring", ...) ->
chorus.v1.Algorithm.
"""
ALGORITHMS.update(
    (name, number) for name, number in _lower_names(
        types_pb2.Algorithm.DESCRIPTOR, "ALGORITHM_").items()
    if name not in _NOT_FORCEABLE)

DEVICE_KINDS: Dict[str, int] = _lower_names(
    types_pb2.DeviceKind.DESCRIPTOR, "DEVICE_KIND_")
"""Device kind name ("cuda") -> chorus.v1.DeviceKind, OTHER aside."""

_DISPLAY: Dict[int, str] = {
    number: name.capitalize() for name, number in DEVICE_KINDS.items()}


def parse_device(device: Union[str, types_pb2.Device]) -> types_pb2.Device:
    """Returns the chorus.v1.Device for "cpu", "cuda:0", "Vulkan(0)",
    "npu:2", ... (a Device as it is). Raises InvalidArgument for a malformed
    name.
    """
    if isinstance(device, types_pb2.Device):
        return device
    if not isinstance(device, str) or not device.strip():
        raise InvalidArgument(
            f"device must be a string such as 'cpu' or 'cuda:0', "
            f"got {device!r}")
    text = device.strip()
    kind_text, index_text = text, ""
    if text.endswith(")") and "(" in text:  # canonical form, Cuda(0)
        kind_text, index_text = text[:-1].split("(", 1)
    elif ":" in text:
        kind_text, index_text = text.split(":", 1)
    index = 0
    if index_text:
        if not index_text.isdigit():
            raise InvalidArgument(
                f"device {device!r} needs a non-negative index, e.g. cuda:0")
        index = int(index_text)
    kind = DEVICE_KINDS.get(kind_text.lower())
    if kind is None:
        if not kind_text.replace("_", "").isalnum():
            raise InvalidArgument(f"device {device!r} has an invalid kind")
        return types_pb2.Device(kind=types_pb2.DEVICE_KIND_OTHER,
                                other_kind=kind_text, index=index)
    if kind == types_pb2.DEVICE_KIND_CPU and index != 0:
        raise InvalidArgument(f"the CPU device has index 0, got {device!r}")
    return types_pb2.Device(kind=kind, index=index)


def canonical_name(device: types_pb2.Device) -> str:
    """Returns the device's canonical name as servers print it: "Cpu",
    "Cuda(0)", the kind string as given for OTHER ("Npu(2)"), and
    "UnknownKind<n>(<index>)" for a kind number this package does not know
    (or OTHER without its string), as CanonicalName() in device.cc.
    """
    if device.kind == types_pb2.DEVICE_KIND_CPU:
        return "Cpu"
    display = (device.other_kind if device.kind == types_pb2.DEVICE_KIND_OTHER
               else _DISPLAY.get(device.kind))
    if not display:
        return f"UnknownKind{device.kind}({device.index})"
    return f"{display}({device.index})"
