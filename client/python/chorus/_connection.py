"""What a call socket's calls travel on and come back as.

A Connection is a channel that takes LocalCallFrames and gives back replies
as chorus._frames reads them: a worker daemon's call socket
(UnixConnection), or an embedded worker's in-process channel
(chorus._embedded.Calls). A reply is a Response, or a CallSocketError shaped
as a failed gRPC call (code, details, trailing metadata with the
google.rpc.Status), which chorus.errors.from_rpc_error() reads as it reads
gRPC's.

Thread safety: see CallSocket, which drives connections.
"""

import functools
import socket
from typing import Any, Callable, NamedTuple, Optional, Protocol, Tuple, Union

import grpc

from chorus import _frames, _status_details

__all__ = ["HELLO", "Reply", "CallSocketError", "Plan", "Response",
           "outcome_of", "Connection", "UnixConnection"]

HELLO: bytes = b"CHORUS-LOCAL/1\n"
"""What a client writes first on a daemon's call socket."""

# How long connecting may take: the socket is local, so at once or never.
_CONNECT_TIMEOUT = 2.0

Reply = Tuple[int, int, str, bytes, bytes, int, int]
"""A reply as chorus._frames reads it: (call_id, code, message,
status_details, data, algorithm, chunk_bytes).
"""


class CallSocketError(grpc.RpcError):
    """A call on the call socket that did not succeed, shaped as a failed
    gRPC call: code(), details() and trailing_metadata() (holding the
    google.rpc.Status with its ErrorDetail, as gRPC sends it).
    """

    def __init__(self, code: grpc.StatusCode, message: str,
                 status_details: bytes = b"") -> None:
        """Makes the error of a call that ended with `code` and `message`."""
        super().__init__(message)
        self._code = code
        self._message = message
        self._status_details = status_details

    def code(self) -> grpc.StatusCode:
        """The call's status code."""
        return self._code

    def details(self) -> str:
        """The call's status message."""
        return self._message

    def trailing_metadata(self) -> Tuple[Tuple[str, bytes], ...]:
        """The status details as gRPC's trailing metadata would carry
        them.
        """
        if not self._status_details:
            return ()
        return ((_status_details.DETAILS_KEY, self._status_details),)


_CODES = {code.value[0]: code for code in grpc.StatusCode}


class Plan(NamedTuple):
    """The plan a call ran, as LocalCollectiveResponse.plan has it."""

    algorithm: int
    chunk_bytes: int


class Response(NamedTuple):
    """What a call that succeeded returns: LocalCollectiveResponse's data
    and plan.
    """

    data: bytes
    plan: Plan


def outcome_of(reply: Reply) -> Tuple[Optional[Response],
                                        Optional[CallSocketError]]:
    """(the response, None) of a reply that says OK, else (None, its
    error).
    """
    _, code, message, details, data, algorithm, chunk_bytes = reply
    if code == 0:
        return Response(data, Plan(algorithm, chunk_bytes)), None
    return None, CallSocketError(_CODES.get(code, grpc.StatusCode.UNKNOWN),
                                 message, details)



class Connection(Protocol):
    """What CallSocket drives: a channel that takes LocalCallFrames and
    gives back replies as chorus._frames reads them. One whose caller can
    run a call itself (an embedded worker's) also has
    run_into(call_id, timeout_us, prefix, sequence, data, out) -> True |
    reply, which runs it on the buffers themselves and returns once the
    call ended (see CallSocket.run_in_place).
    """

    def fileno(self) -> int:
        """A descriptor readable when replies wait (or the channel
        ended).
        """

    def send_call(self, call_id: int, timeout_us: int,
                  parts: Tuple[Any, ...]) -> None:
        """Sends one call; OSError when the channel broke."""

    def wait(self, call_id: int, seconds: float,
             on_reply: Callable[[Reply], bool]) -> Union[Reply, None, bool]:
        """Reads until `call_id`'s reply (returned), the deadline (None) or
        the end (False); other replies go to on_reply.
        """

    def drain(self, on_reply: Callable[[Reply], bool]) -> bool:
        """Passes the replies waiting to on_reply; False at the end."""

    def shutdown(self) -> None:
        """Ends the channel: a thread waiting in wait() returns."""

    def close(self) -> None:
        """Releases the channel, once no thread uses it."""


class UnixConnection:
    """A connection to a worker daemon's call socket (a Connection)."""

    def __init__(self, path: str) -> None:
        """Connects to the call socket at `path` and says hello. Raises
        OSError when it cannot.
        """
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._sock.settimeout(_CONNECT_TIMEOUT)
            self._sock.connect(path)
            self._sock.settimeout(None)
            self._sock.sendall(HELLO)
        except BaseException:
            self._sock.close()
            raise
        fd = self._sock.fileno()
        reader = _frames.Reader(fd)
        self.send_call = functools.partial(_frames.send_call, fd)
        self.wait = reader.wait
        self.drain = reader.drain
        self.fileno = self._sock.fileno

    def shutdown(self) -> None:
        """Shuts the socket down both ways."""
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def close(self) -> None:
        """Closes the socket."""
        self._sock.close()
