"""Chorus errors: one exception class per status code Chorus uses, with the
structure of the status (missing ranks, the lost worker, the per-rank account
of a mismatch) as attributes.

The attributes come from the google.rpc.Status details a server attaches
(trailing metadata "grpc-status-details-bin"): the chorus.v1.ErrorDetail
every Chorus server attaches where it has something structured to say
(proto/chorus/v1/status.proto), or a google.rpc.ErrorInfo or another detail
message with the same fields. The message text is the status's whole story
for people and is never parsed. A status without details has a code and a
message and no other attribute.
"""

import re
from typing import Any, Dict, List, Optional, Sequence, Tuple, Type

import grpc

from chorus import _status_details

__all__ = [
    "Error", "InvalidArgument", "DeadlineExceeded", "Aborted",
    "FailedPrecondition", "Unimplemented", "Unavailable", "NotFound",
    "ResourceExhausted", "DataLoss", "PermissionDenied", "Unauthenticated",
    "Internal", "Cancelled", "MembershipChanged", "from_rpc_error",
    "error_for_code",
]


class Error(Exception):
    """An error from Chorus: a status code and a message, plus what the status
    says about the ranks and workers involved.

    Attributes:
        code: the grpc.StatusCode.
        message: the status message, as the server wrote it.
        group: the group the status names; for a failed collective, the
            communicator's group when the status names none.
        epoch: the group epoch it names, if any.
        sequence: the collective's sequence number the status names; for a
            failed collective, the call's own number when it names none.
        missing_ranks: ranks that did not reach a collective (or a join)
            before the deadline; None when the status names none.
        lost_worker: name of the worker whose loss aborted the group.
        lost_worker_id: the coordinator's id of that worker.
        lost_rank: the first rank that was on the lost worker.
        lost_ranks: every rank that was on the lost worker.
        ranks: the per-rank account of a mismatch or a refusal, rank ->
            what that rank asked for ("all_reduce f32[3] sum") or why it was
            refused.
        device: the device a refusal names, e.g. "Vulkan(0)".
        number_used: for a failed collective, True when the worker daemon
            says the call took its sequence number on this rank (the next
            call takes the next one); False when its status says nothing
            of it (a refusal before the number was taken, or a status gRPC
            made itself).
        next_epoch, next_world_size, next_ranks, joiners_waiting: an
            elastic group's change (reason MEMBERSHIP_CHANGED): the epoch it
            goes on at (0: it waits for newcomers), its size, each old
            rank's rank there (-1: it left), and the newcomers waiting.
        reason: what happened, from the server's chorus.v1.ErrorDetail
            (e.g. "MISMATCH", "RANKS_MISSING", "WORKER_LOST"; the list is in
            proto/chorus/v1/status.proto) or a google.rpc.ErrorInfo; None
            when the server attached neither.
        Every attribute but code, message and details is None (number_used
        False) where the status's details do not say it.
        details: every google.rpc.Status detail, as (type name, fields dict
            or raw bytes) pairs; empty when the server attached none.
    """

    code: grpc.StatusCode = grpc.StatusCode.UNKNOWN

    def __init__(self, message: str, code: Optional[grpc.StatusCode] = None,
                 details: Sequence[Tuple[str, Any]] = ()) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code
        self.message: str = message
        self.details: List[Tuple[str, Any]] = list(details)
        self.group: Optional[str] = None
        self.epoch: Optional[int] = None
        self.sequence: Optional[int] = None
        self.missing_ranks: Optional[List[int]] = None
        self.lost_worker: Optional[str] = None
        self.lost_worker_id: Optional[int] = None
        self.lost_rank: Optional[int] = None
        self.lost_ranks: Optional[List[int]] = None
        self.ranks: Optional[Dict[int, str]] = None
        self.device: Optional[str] = None
        self.number_used: bool = False
        self.reason: Optional[str] = None
        self.next_epoch: Optional[int] = None
        self.next_world_size: Optional[int] = None
        self.next_ranks: Optional[List[int]] = None
        self.joiners_waiting: Optional[int] = None
        for name, value in _from_details(self.details).items():
            setattr(self, name, value)

    def __str__(self) -> str:
        return f"{self.code.name}: {self.message}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r})"

    def __reduce__(self) -> Any:
        return (_rebuild, (self.code.name, self.message, self.details))


def _rebuild(code_name: str, message: str,
             details: List[Tuple[str, Any]]) -> "Error":
    return _error_of(grpc.StatusCode[code_name], message, details)


def _error_of(code: grpc.StatusCode, message: str,
              details: Sequence[Tuple[str, Any]]) -> "Error":
    """The Error of a status: the class of its code, or MembershipChanged
    for an ABORTED whose detail says the membership changed.
    """
    error = error_for_code(code)(message, code, details)
    if isinstance(error, Aborted) and error.reason == "MEMBERSHIP_CHANGED":
        return MembershipChanged(message, code, details)
    return error


class InvalidArgument(Error, ValueError):
    """INVALID_ARGUMENT: bad input, or ranks that disagree on a collective
    (then `ranks` holds each rank's call). Also raised by this package, before
    anything is sent, for input it can check itself.
    """
    code = grpc.StatusCode.INVALID_ARGUMENT


class DeadlineExceeded(Error, TimeoutError):
    """DEADLINE_EXCEEDED: not every rank arrived in time (`missing_ranks`)."""
    code = grpc.StatusCode.DEADLINE_EXCEEDED


class Aborted(Error):
    """ABORTED: the group was aborted, e.g. a worker was lost (`lost_worker`,
    `lost_rank`); join again.
    """
    code = grpc.StatusCode.ABORTED


class MembershipChanged(Aborted):
    """ABORTED with reason MEMBERSHIP_CHANGED: the membership of an elastic
    group (joined with min_world_size) changed, so the call did not run on
    any rank. By the time it is raised the communicator has moved to the
    group's new epoch: redo the step and the next call runs there.

    Attributes (besides Error's):
        epoch: the new epoch.
        world_size: the group's size there.
        rank: this rank's rank there.
        left: the ranks (of the old epoch) that left.
        joined: the ranks (of the new epoch) that joined.
        old_epoch: the epoch that ended.
    """

    def __init__(self, message: str, code: Optional[grpc.StatusCode] = None,
                 details: Sequence[Tuple[str, Any]] = ()) -> None:
        super().__init__(message, code, details)
        self.old_epoch: Optional[int] = self.epoch
        self.epoch = self.next_epoch
        self.world_size: Optional[int] = self.next_world_size
        self.rank: Optional[int] = None
        self.left: List[int] = list(self.lost_ranks or [])
        kept = sum(1 for r in (self.next_ranks or []) if r >= 0)
        self.joined: List[int] = list(range(kept, self.world_size or kept))


class FailedPrecondition(Error):
    """FAILED_PRECONDITION: the call cannot run in the group's state (stale
    epoch, not joined, another rank's device refused).
    """
    code = grpc.StatusCode.FAILED_PRECONDITION


class Unimplemented(Error):
    """UNIMPLEMENTED: a device with no distributed support (`device`)."""
    code = grpc.StatusCode.UNIMPLEMENTED


class Unavailable(Error, ConnectionError):
    """UNAVAILABLE: the worker daemon or the coordinator cannot be reached."""
    code = grpc.StatusCode.UNAVAILABLE


class NotFound(Error):
    """NOT_FOUND: an unknown group or worker."""
    code = grpc.StatusCode.NOT_FOUND


class ResourceExhausted(Error):
    """RESOURCE_EXHAUSTED: a message over the size limit, or a server out of
    a resource.
    """
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class DataLoss(Error):
    """DATA_LOSS: ranks' results that must agree did not."""
    code = grpc.StatusCode.DATA_LOSS


class PermissionDenied(Error):
    """PERMISSION_DENIED: the caller may not do this: act for another
    worker or rank, or use a worker's local API over TCP from another host
    without TLS, or with TLS without a client or admin certificate (the
    message says which).
    """
    code = grpc.StatusCode.PERMISSION_DENIED


class Unauthenticated(Error):
    """UNAUTHENTICATED: the server could not tell who the caller is (e.g.
    a TLS connection without a usable client certificate).
    """
    code = grpc.StatusCode.UNAUTHENTICATED


class Internal(Error):
    """INTERNAL: a server bug or a broken invariant."""
    code = grpc.StatusCode.INTERNAL


class Cancelled(Error):
    """CANCELLED: the call was cancelled (e.g. the channel was closed)."""
    code = grpc.StatusCode.CANCELLED


_BY_CODE: Dict[grpc.StatusCode, Type[Error]] = {
    cls.code: cls for cls in (
        InvalidArgument, DeadlineExceeded, Aborted, FailedPrecondition,
        Unimplemented, Unavailable, NotFound, ResourceExhausted, DataLoss,
        PermissionDenied, Unauthenticated, Internal, Cancelled)
}
_BY_VALUE: Dict[int, grpc.StatusCode] = {
    c.value[0]: c for c in grpc.StatusCode}


def error_for_code(code: grpc.StatusCode) -> Type[Error]:
    """Returns the Error subclass for a status code (Error itself for codes
    Chorus does not use).
    """
    return _BY_CODE.get(code, Error)


def from_rpc_error(error: grpc.RpcError) -> Error:
    """Turns a failed gRPC call into the matching Error subclass, with the
    google.rpc.Status details of its trailing metadata when it has any.
    """
    code = error.code() if hasattr(error, "code") else None
    if not isinstance(code, grpc.StatusCode):
        code = grpc.StatusCode.UNKNOWN
    message = (error.details() if hasattr(error, "details") else None) or ""
    trailing = (error.trailing_metadata()
                if hasattr(error, "trailing_metadata") else None)
    details: List[Tuple[str, Any]] = []
    decoded = _status_details.decode(trailing)
    if decoded is not None:
        status_code, status_message, details = decoded
        code = _BY_VALUE.get(status_code, code)
        message = status_message or message
    return _error_of(code, message, details)


# --- ranks ------------------------------------------------------------------
# The servers write ranks as FormatRanks does: "rank 3", "ranks 0, 2-4".


def parse_ranks(text: str) -> List[int]:
    """Returns the ranks of a rank list such as "0, 2-4" ([0, 2, 3, 4])."""
    ranks: List[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            first, last = part.split("-", 1)
            ranks.extend(range(int(first), int(last) + 1))
        else:
            ranks.append(int(part))
    return ranks


# --- details ---------------------------------------------------------------
# A google.rpc.ErrorInfo's metadata, or any detail message the default pool
# knows, may carry these keys (ranks as "2, 3", "2-4" or a list).

_INT_KEYS = ("epoch", "sequence", "lost_worker_id", "lost_rank",
             "next_epoch", "next_world_size", "joiners_waiting")
_LIST_KEYS = ("missing_ranks", "lost_ranks", "next_ranks")
_TEXT_KEYS = ("group", "lost_worker", "device")


def _as_ranks(value: Any) -> List[int]:
    if isinstance(value, (list, tuple)):
        return [int(v) for v in value]
    return parse_ranks(str(value).strip("[]"))


def _from_details(details: Sequence[Tuple[str, Any]]) -> Dict[str, Any]:
    """Returns the attributes the google.rpc.Status details carry."""
    found: Dict[str, Any] = {}
    for type_name, fields in details:
        if not isinstance(fields, dict):
            continue
        values = dict(fields)
        if type_name == "google.rpc.ErrorInfo":
            if fields.get("reason"):
                found["reason"] = fields["reason"]
            values = dict(fields.get("metadata") or {})
        elif type_name == "chorus.v1.ErrorDetail" and fields.get("reason"):
            found["reason"] = fields["reason"]
        for key in _INT_KEYS:
            if key in values and str(values[key]).strip():
                found[key] = int(values[key])
        for key in _LIST_KEYS:
            if key in values:
                found[key] = _as_ranks(values[key])
        for key in _TEXT_KEYS:
            if key in values:
                found[key] = str(values[key])
        if values.get("number_used") is True:
            found["number_used"] = True
        account = values.get("ranks")
        if isinstance(account, dict):
            found["ranks"] = {int(k): str(v) for k, v in account.items()}
        for key, value in values.items():
            # ErrorInfo metadata can only hold strings: "rank.3" -> account.
            if isinstance(key, str) and re.fullmatch(r"rank\.\d+", key):
                found.setdefault("ranks", {})[int(key[5:])] = str(value)
    if "lost_ranks" in found and "lost_rank" not in found and found[
            "lost_ranks"]:
        found["lost_rank"] = found["lost_ranks"][0]
    return found
