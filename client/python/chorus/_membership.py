"""Elastic groups as a communicator sees them: the Membership that sync()
and a change hand back, the rank's hold on its worker (which moves with the
rank into each new epoch), and following the group into its next epoch.

A group joined with min_world_size goes on when members are lost: the
calls of the epoch they left end with chorus.MembershipChanged, and each
surviving rank follows the group into its next epoch (a JoinGroup with
follow_epoch), where it may have another rank. Newcomers join without a
rank and wait; a sync() of the members admits them (chorus.Communicator).

Thread safety: Hold's methods may be called from any thread; follow() is a
pure call.
"""

import dataclasses
import queue
from typing import Any, Iterator, List, Optional

import grpc

from chorus.errors import from_rpc_error
from chorus.v1 import types_pb2, worker_pb2, worker_pb2_grpc

__all__ = ["Membership", "Hold", "follow"]

_HOLD_METHOD = "/chorus.v1.WorkerLocal/HoldMembership"


@dataclasses.dataclass(frozen=True)
class Membership:
    """A rank's membership of an elastic group, as sync() returns it.

    Attributes:
        epoch: the group's epoch.
        world_size: the number of ranks.
        rank: this rank.
        joined: the ranks that joined since the previous epoch.
        left: the ranks (of the previous epoch) that left.
    """

    epoch: int
    world_size: int
    rank: int
    joined: List[int] = dataclasses.field(default_factory=list)
    left: List[int] = dataclasses.field(default_factory=list)


class Hold:
    """The rank's hold on its worker (WorkerLocal.HoldMembership): while
    this process lives the stream stays open; if the process dies it ends
    without a release, the worker reports the rank gone, and the other
    ranks' calls end at once (an elastic group goes on without it).
    move() names the rank's membership of a new epoch on the same stream;
    release() ends it on purpose (a rank of an elastic group leaves). The
    stream has no deadline: nothing waits for it.
    """

    def __init__(self, channel: grpc.Channel, group: str, epoch: int,
                 rank: int) -> None:
        """Opens the hold of `rank` of `group` at `epoch` on `channel`."""
        self._group = group
        self._holds: "queue.SimpleQueue[Any]" = queue.SimpleQueue()
        self._holds.put(worker_pb2.MembershipHold(group=group, epoch=epoch,
                                                  rank=rank))
        held = self._holds

        def holds() -> Iterator[worker_pb2.MembershipHold]:
            while True:  # on gRPC's request thread
                hold = held.get()
                yield hold
                if hold.release:
                    return

        method = channel.stream_unary(
            _HOLD_METHOD,
            request_serializer=worker_pb2.MembershipHold.SerializeToString,
            response_deserializer=worker_pb2.MembershipHoldReply.FromString)
        self._future = method.future(holds())

    def move(self, epoch: int, rank: int) -> None:
        """The rank is now `rank` of the group's epoch `epoch`."""
        self._holds.put(worker_pb2.MembershipHold(
            group=self._group, epoch=epoch, rank=rank))

    def release(self, wait: float) -> None:
        """Ends the hold on purpose and waits up to `wait` seconds for the
        worker to take it. Idempotent.
        """
        self._holds.put(worker_pb2.MembershipHold(release=True))
        try:
            self._future.result(timeout=wait)
        except (grpc.RpcError, grpc.FutureTimeoutError):
            pass  # an older daemon without holds, or one already gone


def follow(channel: grpc.Channel, group: str, rank: int, epoch: int,
           device: types_pb2.Device, timeout: float) -> Any:
    """Moves `rank` of `group` from its revoked epoch `epoch` into the
    group's next one (waiting while the group is below its minimum); returns
    the worker's LocalJoinResponse. Raises the chorus.Error of a refusal:
    FailedPrecondition with reason RANK_EXCLUDED when the rank was declared
    lost, DeadlineExceeded when no next epoch formed in time.
    """
    stub = worker_pb2_grpc.WorkerLocalStub(channel)
    try:
        return stub.JoinGroup(
            worker_pb2.LocalJoinRequest(group=group, rank=rank,
                                        follow_epoch=epoch, device=device),
            timeout=timeout)
    except grpc.RpcError as e:
        raise from_rpc_error(e) from None


def joined_ranks(old_world: int, new_world: int) -> List[int]:
    """The ranks a sync admitted: those past the members."""
    return list(range(old_world, new_world))


def optional_bound(name: str, value: Optional[int]) -> int:
    """An elastic bound as join() takes it: None is 0 (not set)."""
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value
