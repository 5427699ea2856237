"""The elastic half of a Communicator: sync(), and moving a rank into its
group's next epoch after a change (chorus._membership says how elastic
groups go).

Elastic is a base class of chorus.Communicator: it reads and sets the
communicator's membership (_epoch, _rank, _world_size, ...) under its
_switch lock and rebuilds its per-epoch parts with _build().

Thread safety: a change seen by an asynchronous call is recorded by the
settling thread (_saw_change) and followed by the next call, or when the
rank, world size or epoch is read; a blocking call follows before it raises.
"""

from typing import Any, List, Optional

from chorus import _membership
from chorus._call import Call
from chorus._membership import Membership
from chorus.errors import Error, MembershipChanged
from chorus.v1 import worker_pb2

__all__ = ["Elastic"]


class Elastic:
    """sync() and following the group into its next epoch, for a
    Communicator (which sets up the attributes this class reads).
    """

    _group: str
    _epoch: int
    _rank: int
    _world_size: int
    _member_devices: List[str]
    _joiners_waiting: int
    _change: Optional[MembershipChanged]
    _retired: List[Any]

    def sync(self, *, timeout: Optional[float] = None) -> Membership:
        """A step boundary of an elastic group: every member calls it, as
        any collective; it admits the newcomers waiting to join (up to
        max_world_size), after the members, and returns the membership
        this rank goes on with (with no newcomer waiting: the same one, for
        one small round trip). Once it returns, calls run in that epoch,
        numbered from 1 again; the members keep their ranks.

        Raises:
            MembershipChanged: a member was lost meanwhile (sync again).
            The errors of any collective.
        """
        old_world = self.world_size  # follows a change first
        data = self._run(Call("sync", None, 0, timeout=timeout))
        outcome = worker_pb2.SyncOutcome.FromString(data or b"")
        self._joiners_waiting = outcome.joiners_waiting
        if not outcome.HasField("next"):
            return Membership(self._epoch, self._world_size, self._rank)
        with self._switch:
            self._move_to(outcome.next)
            return Membership(
                self._epoch, self._world_size, self._rank,
                joined=_membership.joined_ranks(old_world, self._world_size))

    def _saw_change(self, error: MembershipChanged) -> None:
        """Records a change an asynchronous call saw (on the thread that
        settled it), for the next call to follow.
        """
        self._change = error

    def _catch_up(self) -> None:
        """Follows a change an asynchronous call saw, if any; a rank the
        change excluded stays as it was (its next call raises why).
        """
        change = self._change
        if change is None:
            return
        try:
            self._follow(change)
        except Error:
            pass

    def _follow(self, error: MembershipChanged) -> None:
        """Moves this rank into the epoch that followed the one `error`
        revoked (unless it did already) and fills `error`'s epoch, world
        size and rank. Raises the refusal of the move: FailedPrecondition
        (reason RANK_EXCLUDED) for a rank that was declared lost.
        """
        with self._switch:
            if self._change is error:
                self._change = None
            if error.joiners_waiting is not None:
                self._joiners_waiting = error.joiners_waiting
            if error.old_epoch is not None and error.old_epoch == self._epoch:
                response = _membership.follow(
                    self._channel, self._group, self._rank, self._epoch,
                    self._device_proto, self._timeout)
                self._move_to(response)
            error.epoch = self._epoch
            error.world_size = self._world_size
            error.rank = self._rank

    def _move_to(self, response: Any) -> None:
        """(Under _switch.) This rank is now the LocalJoinResponse's: its
        calls carry the new epoch, numbered from 1, and its hold moves.
        """
        self._retired.append((self._numbering, self._routes, self._shared))
        self._epoch = response.epoch
        self._world_size = response.world_size
        self._rank = response.rank
        self._member_devices = list(response.member_devices)
        self._build()
        self._hold.move(self._epoch, self._rank)
