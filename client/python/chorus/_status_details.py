"""Reads the google.rpc.Status a server may attach to an error, from the
trailing metadata entry "grpc-status-details-bin".

google.rpc.Status and google.rpc.ErrorInfo are declared here in a descriptor
pool of this module's own, so they never clash with another package that
registers the same names in protobuf's default pool. The chorus.v1.ErrorDetail
that Chorus's servers attach (proto/chorus/v1/status.proto) comes from the
generated stubs. Details of any other type are unpacked when their type is
known to the default pool, and kept as raw bytes otherwise.
"""

from typing import Any, Dict, List, Optional, Sequence, Tuple

from google.protobuf import any_pb2, descriptor_pb2, descriptor_pool
from google.protobuf import json_format, message_factory, symbol_database

# Imported for its side effect too: it puts chorus.v1.ErrorDetail into the
# default pool, where _unpack finds it.
from chorus.v1 import status_pb2  # noqa: F401

DETAILS_KEY = "grpc-status-details-bin"

_FIELD = descriptor_pb2.FieldDescriptorProto


def _build_pool() -> descriptor_pool.DescriptorPool:
    pool = descriptor_pool.DescriptorPool()
    any_file = descriptor_pb2.FileDescriptorProto()
    any_pb2.DESCRIPTOR.CopyToProto(any_file)
    pool.Add(any_file)

    rpc = descriptor_pb2.FileDescriptorProto(
        name="chorus/_client/google_rpc.proto",
        package="google.rpc",
        syntax="proto3",
        dependency=[any_file.name],
    )
    status = rpc.message_type.add(name="Status")
    status.field.add(name="code", number=1, type=_FIELD.TYPE_INT32,
                     label=_FIELD.LABEL_OPTIONAL)
    status.field.add(name="message", number=2, type=_FIELD.TYPE_STRING,
                     label=_FIELD.LABEL_OPTIONAL)
    status.field.add(name="details", number=3, type=_FIELD.TYPE_MESSAGE,
                     label=_FIELD.LABEL_REPEATED,
                     type_name=".google.protobuf.Any")

    info = rpc.message_type.add(name="ErrorInfo")
    info.field.add(name="reason", number=1, type=_FIELD.TYPE_STRING,
                   label=_FIELD.LABEL_OPTIONAL)
    info.field.add(name="domain", number=2, type=_FIELD.TYPE_STRING,
                   label=_FIELD.LABEL_OPTIONAL)
    entry = info.nested_type.add(name="MetadataEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, type=_FIELD.TYPE_STRING,
                    label=_FIELD.LABEL_OPTIONAL)
    entry.field.add(name="value", number=2, type=_FIELD.TYPE_STRING,
                    label=_FIELD.LABEL_OPTIONAL)
    info.field.add(name="metadata", number=3, type=_FIELD.TYPE_MESSAGE,
                   label=_FIELD.LABEL_REPEATED,
                   type_name=".google.rpc.ErrorInfo.MetadataEntry")
    pool.Add(rpc)
    return pool


def _message_class(pool: descriptor_pool.DescriptorPool, name: str) -> Any:
    descriptor = pool.FindMessageTypeByName(name)
    if hasattr(message_factory, "GetMessageClass"):
        return message_factory.GetMessageClass(descriptor)
    return message_factory.MessageFactory(pool).GetPrototype(descriptor)


_POOL = _build_pool()
Status = _message_class(_POOL, "google.rpc.Status")
ErrorInfo = _message_class(_POOL, "google.rpc.ErrorInfo")


def _type_name(type_url: str) -> str:
    return type_url.rsplit("/", 1)[-1]


def _unpack(detail: Any) -> Tuple[str, Any]:
    """Returns (full type name, fields as a dict or the raw bytes)."""
    name = _type_name(detail.type_url)
    if name == "google.rpc.ErrorInfo":
        info = ErrorInfo.FromString(detail.value)
        return name, {"reason": info.reason, "domain": info.domain,
                      "metadata": dict(info.metadata)}
    try:
        cls = symbol_database.Default().GetSymbol(name)
    except KeyError:
        return name, bytes(detail.value)
    message = cls.FromString(detail.value)
    return name, json_format.MessageToDict(
        message, preserving_proto_field_name=True)


def encode(code: int, message: str, details: Sequence[Any] = ()) -> bytes:
    """Returns a serialized google.rpc.Status (used by tests and by servers
    written in Python); `details` are messages packed into Any.
    """
    status = Status(code=code, message=message)
    for detail in details:
        packed = status.details.add()
        packed.Pack(detail)
    return status.SerializeToString()


def error_info(reason: str, domain: str, metadata: Dict[str, str]) -> Any:
    """Returns a google.rpc.ErrorInfo message."""
    return ErrorInfo(reason=reason, domain=domain, metadata=metadata)


def decode(trailing_metadata: Optional[Sequence[Tuple[str, Any]]]
           ) -> Optional[Tuple[int, str, List[Tuple[str, Any]]]]:
    """Returns (code, message, [(type name, fields)]) from the
    grpc-status-details-bin entry of trailing metadata, or None when there is
    none or it does not parse.
    """
    for key, value in trailing_metadata or ():
        if key != DETAILS_KEY:
            continue
        try:
            status = Status.FromString(bytes(value))
            return (status.code, status.message,
                    [_unpack(d) for d in status.details])
        except Exception:  # a malformed entry is no reason to hide the error
            return None
    return None
