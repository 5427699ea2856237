"""chorus: collective operations (all-reduce, all-gather, broadcast, ...)
across ranks, through the local API of a Chorus worker daemon.

    import numpy as np, chorus
    with chorus.join("g", 2, 0) as comm:  # the local worker's Unix socket
        total = comm.all_reduce(np.array([1, 2, 3], dtype=np.float32))

Without worker= (or $CHORUS_WORKER) join() goes through the socket a worker
on this host serves by default, chorus.default_socket_path(); worker= takes
"unix:/path" or "host:port", and tls_dir= (or $CHORUS_TLS_DIR) turns on
mutual TLS for a host:port worker started with --tls_dir. With
coordinator="host:port" instead, the rank runs a worker runtime in this
process (chorus.embedded) and skips the daemon's hop.

Every failure is a chorus.Error subclass carrying the gRPC status code and,
where the status says so, the ranks and workers involved. See README.md next
to this package for the whole API.
"""

from chorus._connect import default_socket_path
from chorus.embedded import EmbeddedWorker
from chorus._dtypes import DTYPES, bf16_to_f32, dtype_name, f32_to_bf16
from chorus.communicator import (DEFAULT_TIMEOUT, MAX_MESSAGE_BYTES,
                                 SHARED_THRESHOLD_BYTES,
                                 STREAM_THRESHOLD_BYTES, Communicator,
                                 Membership, Work, join)
from chorus.errors import (Aborted, Cancelled, DataLoss, DeadlineExceeded,
                           Error, FailedPrecondition, Internal,
                           InvalidArgument, MembershipChanged, NotFound,
                           PermissionDenied,
                           ResourceExhausted, Unauthenticated, Unavailable,
                           Unimplemented)

__version__ = "0.1.0"
"""The version of this package."""

__all__ = [
    "join", "default_socket_path", "Communicator", "Membership", "Work",
    "EmbeddedWorker",
    "DEFAULT_TIMEOUT",
    "MAX_MESSAGE_BYTES", "STREAM_THRESHOLD_BYTES", "SHARED_THRESHOLD_BYTES",
    "DTYPES", "dtype_name", "bf16_to_f32", "f32_to_bf16",
    "Error", "InvalidArgument", "DeadlineExceeded", "Aborted",
    "FailedPrecondition", "Unimplemented", "Unavailable", "NotFound",
    "ResourceExhausted", "DataLoss", "PermissionDenied", "Unauthenticated",
    "Internal", "Cancelled", "MembershipChanged",
]
