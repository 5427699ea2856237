"""Where a worker daemon's local API is and how to reach it.

The daemon serves the local API on a Unix domain socket (--local_socket,
mode 0600) and on its TCP --listen address, where it answers only loopback
callers, or, with TLS, callers holding a client or admin certificate. This
module finds the default socket exactly as the daemon computes it
(server/worker/local_socket.cc, DefaultLocalSocketPath) and makes the
channel: plaintext on a Unix socket, mutual TLS on TCP when a TLS directory
is given.
"""

import ipaddress
import os
import re
import socket
import ssl
import stat
import struct
from typing import List, Optional, Tuple, Union

import grpc

from chorus.errors import InvalidArgument, PermissionDenied, Unavailable

__all__ = ["default_socket_path", "TLS_FILES"]

TLS_FILES: Tuple[str, str, str] = ("ca.pem", "cert.pem", "key.pem")
"""The files of a TLS directory, as scripts/dev_certs.sh writes them: the CA
the worker's certificate must chain to, this client's certificate, its key.
"""

PathLike = Union[str, "os.PathLike[str]"]
"""A directory given as a str or an os.PathLike (e.g. a pathlib.Path)."""


def default_socket_path() -> str:
    """Returns the Unix socket a worker started with --local_socket=default
    (its default) serves its local API on: $XDG_RUNTIME_DIR/chorus/worker.sock,
    or /tmp/chorus-<uid>/worker.sock when XDG_RUNTIME_DIR is unset or empty.
    It is read from the environment at each call, as the daemon reads it at
    startup, so client and daemon agree when they share the environment.
    """
    runtime_dir = os.environ.get("XDG_RUNTIME_DIR")
    if runtime_dir:
        return f"{runtime_dir}/chorus/worker.sock"
    return f"/tmp/chorus-{os.getuid()}/worker.sock"


def is_unix_target(target: str) -> bool:
    """Whether a gRPC target names a Unix domain socket."""
    return target.startswith(("unix:", "unix-abstract:"))


def is_this_host(target: str) -> bool:
    """Whether a gRPC target is surely a worker on this host: a Unix socket,
    or a loopback address ("127.0.0.1:7100", "[::1]:7100", "localhost:...").
    A file path the worker names (its call socket) is then its own, not
    that of another worker that happens to serve the same path here.
    """
    if is_unix_target(target):
        return True
    for scheme in ("dns:///", "ipv4:", "ipv6:"):
        if target.startswith(scheme):
            target = target[len(scheme):]
    host = target.rsplit(":", 1)[0] if ":" in target else target
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _host_port(target: str) -> Optional[Tuple[str, int]]:
    """(host, port) of a TCP gRPC target ("host:port", "[v6]:port",
    "dns:///host:port", "ipv4:a.b.c.d:port"); None for any other form.
    """
    for scheme in ("dns:///", "ipv4:", "ipv6:"):
        if target.startswith(scheme):
            target = target[len(scheme):]
    if ":" not in target or "/" in target or "," in target:
        return None
    host, port = target.rsplit(":", 1)
    host = host.strip("[]")
    if not host or not port.isdigit():
        return None
    return host, int(port)


# A worker's identity, of the default job or of one named.
_WORKER_URI = re.compile(
    r"chorus://(job/[A-Za-z0-9._-]+/)?worker/[A-Za-z0-9._-]+")


def check_worker_certificate(target: str, tls_dir: str, source: str,
                             timeout: float) -> None:
    """Checks that the server at the TCP `target` presents a certificate
    that names a Chorus worker (chorus://worker/NAME, or
    chorus://job/JOB/worker/NAME for a job's), as Chorus's own
    channels check the role they dial. gRPC's Python channel checks only
    the CA and the host name, so this makes a TLS handshake of its own with
    the files of `tls_dir` and reads the certificate's names.

    Raises Unavailable when the handshake fails or the certificate names
    another role (e.g. a coordinator's port), InvalidArgument for a target
    whose host and port cannot be told.
    """
    where = _host_port(target)
    if where is None:
        raise InvalidArgument(
            f"cannot check the certificate of the worker at {target!r} "
            f"(from {source}): give it as host:port")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False  # the gRPC channel checks the host
    context.verify_mode = ssl.CERT_REQUIRED
    context.load_verify_locations(os.path.join(tls_dir, TLS_FILES[0]))
    context.load_cert_chain(os.path.join(tls_dir, TLS_FILES[1]),
                            os.path.join(tls_dir, TLS_FILES[2]))
    context.set_alpn_protocols(["h2"])
    try:
        with socket.create_connection(where, timeout=timeout) as raw:
            with context.wrap_socket(raw) as tls:
                names = tls.getpeercert().get("subjectAltName", ())
    except (OSError, ssl.SSLError) as e:
        raise Unavailable(
            f"TLS with the worker at {target} (with {source}) failed: "
            f"{e}") from None
    uris = [value for kind, value in names if kind == "URI"]
    if not any(_WORKER_URI.fullmatch(uri) for uri in uris):
        raise Unavailable(
            f"the server at {target} is no Chorus worker: its certificate "
            f"names {', '.join(uris) or 'no chorus:// identity'}, not "
            f"chorus://worker/NAME")


def _unix_path(target: str) -> Optional[str]:
    """The file a unix: target names ("unix:PATH" or "unix:///abs/path"),
    or None for an abstract socket (no file).
    """
    if target.startswith("unix-abstract:"):
        return None
    if target.startswith("unix://"):
        return target[len("unix://"):]
    return target[len("unix:"):]


def resolve_worker(worker: Optional[str]) -> Tuple[str, bool]:
    """Returns (the gRPC target of the worker's local API, whether it is the
    default socket): `worker` when given, else $CHORUS_WORKER, else
    "unix:" + default_socket_path().

    Raises InvalidArgument for a target that is not a string or is a bare
    file path (which gRPC would take for a host name).
    """
    if worker is None:
        worker = os.environ.get("CHORUS_WORKER") or None
        if worker is None:
            return "unix:" + default_socket_path(), True
        source = f"CHORUS_WORKER={worker!r}"
    else:
        source = f"worker={worker!r}"
    if not isinstance(worker, str) or not worker:
        raise InvalidArgument(
            f"worker must be 'unix:/path' or 'host:port' (the worker "
            f"daemon's local API), got {worker!r}")
    if worker.startswith(("/", "./", "../")):
        raise InvalidArgument(
            f"{source} is a file path; a worker's Unix socket is named "
            f"'unix:{worker}'")
    return worker, False


def check_socket(target: str, is_default: bool) -> None:
    """For a unix: target, makes sure its socket file exists before a
    channel is made, so that a missing worker is reported at once, naming
    the path. Does nothing for other targets.

    Raises Unavailable when nothing is at the path, InvalidArgument when
    something other than a socket is, PermissionDenied when the process
    serving it belongs to another user (not this one, not root).
    """
    if not is_unix_target(target):
        return
    path = _unix_path(target)
    if not path:
        return
    try:
        info = os.stat(path)
    except FileNotFoundError:
        if is_default:
            where = ("$XDG_RUNTIME_DIR/chorus/worker.sock"
                     if os.environ.get("XDG_RUNTIME_DIR") else
                     "/tmp/chorus-<uid>/worker.sock, as XDG_RUNTIME_DIR is "
                     "unset")
            message = (
                f"no worker daemon's socket at {path} (the default local "
                f"socket, {where}): start chorus-worker on this host with "
                f"the same XDG_RUNTIME_DIR, or point at a worker with "
                f"worker='unix:/path/of/its/--local_socket' or "
                f"worker='host:port', or set CHORUS_WORKER")
        else:
            message = (
                f"no worker daemon's socket at {path} ({target}): is a "
                f"chorus-worker running with --local_socket={path}?")
        raise Unavailable(message, grpc.StatusCode.UNAVAILABLE) from None
    except OSError as e:
        raise Unavailable(
            f"cannot reach the worker daemon's socket {path}: {e.strerror}",
            grpc.StatusCode.UNAVAILABLE) from None
    if not stat.S_ISSOCK(info.st_mode):
        raise InvalidArgument(
            f"{path} ({target}) is not a socket; pass the path of the "
            f"worker's --local_socket")
    _check_socket_peer(path, target)


def _check_socket_peer(path: str, target: str) -> None:
    """Raises PermissionDenied when the process serving the socket at `path`
    runs as another user than this one or root (SO_PEERCRED): it could be
    posing as the worker. Does nothing when nothing answers there (the
    channel reports that).
    """
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            probe.settimeout(1.0)
            probe.connect(path)
            creds = probe.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                     struct.calcsize("3i"))
    except OSError:
        return
    _, uid, _ = struct.unpack("3i", creds)
    if uid not in (os.geteuid(), 0):
        raise PermissionDenied(
            f"the socket {path} ({target}) is served by uid {uid}, not by "
            f"this user (uid {os.geteuid()}) or root: another user's "
            f"process may be posing as your worker; start your own worker "
            f"with a --local_socket in a directory only you can write")


def resolve_tls_dir(tls_dir: Optional[PathLike]) -> Tuple[Optional[str], str]:
    """Returns (the TLS directory to use or None for plaintext, how it was
    given, for messages): `tls_dir` when given ("" means plaintext), else
    $CHORUS_TLS_DIR when set and not empty.
    """
    if tls_dir is None:
        text = os.environ.get("CHORUS_TLS_DIR") or None
        if text is None:
            return None, ""
        return text, f"CHORUS_TLS_DIR={text!r}"
    tls_dir = tls_dir_text(tls_dir)
    if not tls_dir:
        return None, ""
    return tls_dir, f"tls_dir={tls_dir!r}"


def tls_dir_text(tls_dir: PathLike) -> str:
    """`tls_dir` as a str ("" for plaintext); InvalidArgument for anything
    that is not a path.
    """
    if isinstance(tls_dir, os.PathLike):
        tls_dir = os.fspath(tls_dir)
    if not isinstance(tls_dir, str):
        raise InvalidArgument(
            f"tls_dir must be a directory path (str or os.PathLike), got "
            f"{tls_dir!r}")
    return tls_dir


def tls_credentials(tls_dir: str, source: str) -> grpc.ChannelCredentials:
    """Reads ca.pem, cert.pem and key.pem from `tls_dir` and returns mutual
    TLS credentials for a channel to a worker: the server must present a
    certificate from that CA naming the host dialed (and, checked by
    check_worker_certificate(), a worker), and this client presents its
    own.

    Raises InvalidArgument naming the file that is missing, unreadable or
    not PEM.
    """
    if not os.path.isdir(tls_dir):
        raise InvalidArgument(
            f"{source} is not a directory; it must hold "
            f"{', '.join(TLS_FILES)} (scripts/dev_certs.sh makes them, e.g. "
            f"its client-NAME directory)")
    contents: List[bytes] = []
    for name in TLS_FILES:
        path = os.path.join(tls_dir, name)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as e:
            raise InvalidArgument(
                f"cannot read {path} ({e.strerror}): the TLS directory "
                f"({source}) must hold {', '.join(TLS_FILES)}") from None
        if b"-----BEGIN " not in data:
            raise InvalidArgument(
                f"{path} is not a PEM file (from {source})")
        contents.append(data)
    ca, cert, key = contents
    return grpc.ssl_channel_credentials(
        root_certificates=ca, private_key=key, certificate_chain=cert)


def make_channel(target: str,
                 credentials: Optional[grpc.ChannelCredentials],
                 options: List[Tuple[str, int]]) -> grpc.Channel:
    """Returns a channel to `target`: plaintext for a Unix socket (the
    socket's permissions guard it) or without credentials, secure with
    `credentials` (tls_credentials()) otherwise.
    """
    if credentials is None or is_unix_target(target):
        return grpc.insecure_channel(target, options=options)
    return grpc.secure_channel(target, credentials, options=options)
