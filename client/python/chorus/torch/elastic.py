"""ElasticGroup: torch training that goes on when ranks leave or join.

torch.distributed's groups have a fixed rank and size: its default group
cannot shrink or grow. Chorus already detects a lost rank, agrees on the
next membership and admits newcomers at a step boundary (an elastic group,
chorus.join(..., min_world_size=)), so what a torch user still needs is a
process group for the current membership. ElasticGroup is that helper: it
joins an elastic Chorus group, hands out a ProcessGroupChorus for the
current epoch (rebuilt after every change) and, at every step boundary,
admits newcomers and hands them rank 0's model state.

It is a helper rather than a manager in the spirit of torchft's (which
forms a quorum of replica groups every step on top of NCCL or Gloo),
because the quorum is Chorus's own: the coordinator decides the
membership, and every rank learns it from the status of its next call.

    group = ElasticGroup("job", world_size=4, rank=rank, min_world_size=2)
    step = 0
    while step < steps:
        try:
            step = group.sync(model, step=step)   # newcomers get the state
            loss_of(model, batch(step, group.rank)).backward()
            for p in model.parameters():
                dist.all_reduce(p.grad, group=group.process_group)
                p.grad /= group.world_size
            optimizer.step()
            step += 1
        except chorus.MembershipChanged:
            pass  # a rank was lost: the group went on without it; redo

A newcomer passes rank=None and calls sync() like every member: its first
one takes part in handing out the state and returns the members' step.
DistributedDataParallel holds its process group: build it again when
`epoch` changed.

Thread safety: one thread per ElasticGroup calls sync(); process_group,
rank, world_size and epoch may be read from any thread.
"""

import threading
from typing import Dict, List, Optional

import torch
import torch.nn

import chorus
from chorus.torch._process_group import ProcessGroupChorus
from chorus.torch._tensors import Staged

__all__ = ["ElasticGroup"]


def _broadcast(comm: "chorus.Communicator",
               tensors: List[torch.Tensor]) -> None:
    """Overwrites `tensors` with rank 0's, one broadcast per dtype, on the
    communicator itself (its errors are raised as they are). Raises the
    chorus.Error of a failed broadcast.
    """
    by_dtype: Dict[torch.dtype, List[torch.Tensor]] = {}
    for tensor in tensors:
        by_dtype.setdefault(tensor.dtype, []).append(tensor)
    for same in by_dtype.values():
        flat = torch.cat([t.detach().reshape(-1).cpu() for t in same])
        staged = Staged(flat, "the state's tensor")
        comm.broadcast(staged.array, 0, out=staged.array, dtype=staged.dtype)
        offset = 0
        with torch.no_grad():
            for tensor in same:
                n = tensor.numel()
                tensor.copy_(flat[offset:offset + n].view_as(tensor))
                offset += n


class ElasticGroup:
    """A rank of an elastic Chorus group, seen from torch: the process
    group of the current membership and the step boundary where newcomers
    are admitted.

    Made by the constructor (which joins); ended by close() or leave().
    """

    def __init__(self, group: str, world_size: Optional[int],
                 rank: Optional[int], *, min_world_size: int,
                 max_world_size: Optional[int] = None,
                 worker: Optional[str] = None,
                 coordinator: Optional[str] = None, device: str = "cpu",
                 timeout: float = 60.0, tls_dir: Optional[str] = None
                 ) -> None:
        """Joins `group` (chorus.join with the same arguments): as `rank`
        of `world_size`, or with rank=None as a newcomer that waits until a
        sync() of the members admits it.

        Raises what chorus.join raises: InvalidArgument (bounds that do not
        fit the world size, ranks that disagree), DeadlineExceeded (not
        every rank joined, or no sync admitted the newcomer, within
        `timeout`), FailedPrecondition (a newcomer to a group that is not
        elastic), Unavailable (no worker or coordinator to reach).
        """
        self._comm = chorus.join(group, world_size, rank, worker=worker,
                                 coordinator=coordinator, device=device,
                                 timeout=timeout, tls_dir=tls_dir,
                                 min_world_size=min_world_size,
                                 max_world_size=max_world_size)
        self._lock = threading.Lock()
        self._process_group = ProcessGroupChorus(self._comm)
        self._process_group_epoch = self._comm.epoch
        # Set while the state of the last admission is still to be handed
        # out: a newcomer's first sync(), and every rank's sync() after a
        # change interrupted the hand-out.
        self._state_due = rank is None

    @property
    def communicator(self) -> "chorus.Communicator":
        """The chorus.Communicator underneath (its own collectives on
        numpy arrays are at hand too)."""
        return self._comm

    @property
    def process_group(self) -> ProcessGroupChorus:
        """The torch process group of the current membership, for
        dist.all_reduce(..., group=) and the other collectives that take a
        group (a new one after every change; pass it where torch wants
        one, do not keep it across a MembershipChanged)."""
        epoch = self._comm.epoch  # follows a change an async call saw
        with self._lock:
            if epoch != self._process_group_epoch:
                self._process_group = ProcessGroupChorus(self._comm)
                self._process_group_epoch = epoch
            return self._process_group

    @property
    def rank(self) -> int:
        """This rank in the current membership."""
        return self._comm.rank

    @property
    def world_size(self) -> int:
        """The ranks of the current membership."""
        return self._comm.world_size

    @property
    def epoch(self) -> int:
        """The group epoch this rank is in; it changes with every change of
        the membership."""
        return self._comm.epoch

    def sync(self, *modules: torch.nn.Module, step: int = 0) -> int:
        """The step boundary: every rank calls it, the newcomers too.
        Admits the newcomers waiting (chorus.Communicator.sync) and, when
        any were admitted, overwrites every rank's parameters and buffers
        of `modules` with rank 0's and returns rank 0's `step`; otherwise
        returns `step` and moves no data.

        Raises:
            chorus.MembershipChanged: a rank was lost meanwhile; the group
                already went on without it, call sync() again (the state
                is handed out then if it was not yet).
            The errors of any collective.
        """
        if not self._state_due:
            self._state_due = bool(self._comm.sync().joined)
            if not self._state_due:
                return step
        tensors = [t for module in modules for t in
                   list(module.parameters()) + list(module.buffers())]
        counter = torch.tensor([step], dtype=torch.int64)
        _broadcast(self._comm, tensors + [counter])
        self._state_due = False
        return int(counter[0])

    def leave(self, timeout: Optional[float] = None) -> None:
        """Leaves the group cleanly: the others get MembershipChanged
        naming this rank and go on without it."""
        self._comm.leave(timeout)

    def close(self, timeout: Optional[float] = None) -> None:
        """Ends this rank's membership (as chorus.Communicator.close)."""
        self._comm.close(timeout)

    def __enter__(self) -> "ElasticGroup":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
