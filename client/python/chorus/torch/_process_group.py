"""ProcessGroupChorus: the torch process group of the "chorus" backend,
whose collectives are Chorus collectives of one Chorus group (made by
chorus.torch.backend.create_process_group()).

Each collective stages the caller's tensors as numpy arrays
(chorus.torch._tensors), issues one asynchronous Chorus call on the group's
communicator, and returns the torch work its completion ends
(chorus.torch._work).

Thread safety: the methods may be called from any thread (the communicator
numbers the calls in the order they reach it).
"""

import sys
from typing import Any, Callable, List, Optional, Sequence

import numpy as np
import torch
import torch.distributed as dist

import chorus
from chorus.errors import InvalidArgument
from chorus.torch import _tensors
from chorus.torch._tensors import Staged
from chorus.torch._work import ChorusWork, Completion, Finish, cpp_work

__all__ = ["BACKEND", "ProcessGroupChorus"]

BACKEND: str = "chorus"
"""The backend's name for init_process_group and new_group."""

# torch's reduce ops -> Chorus's. BAND, BOR, BXOR and PREMUL_SUM have none.
_OPS = {
    "SUM": "sum",
    "PRODUCT": "prod",
    "MIN": "min",
    "MAX": "max",
    "AVG": "avg",
}

# The module whose functions (dist.all_reduce, ...) wait on works from
# Python; see chorus.torch._work.
_TORCH_FUNCTIONS = "torch.distributed.distributed_c10d"



def _reduce_op(op: Any, kind: str) -> str:
    """The Chorus name of a torch ReduceOp, or InvalidArgument."""
    kind_of = getattr(op, "op", op)  # 1.13: a ReduceOp wrapping RedOpType
    name = getattr(kind_of, "name", str(kind_of)).split(".")[-1]
    if name not in _OPS:
        raise InvalidArgument(
            f"the chorus backend cannot {kind} with ReduceOp.{name}; Chorus "
            f"reduces with {', '.join('ReduceOp.' + o for o in _OPS)}")
    return _OPS[name]


def _called_from_torch_python() -> bool:
    """Whether the collective method calling this was called by a Python
    function of torch.distributed, which waits on the work from Python.
    """
    try:
        caller = sys._getframe(2)  # 0: here, 1: the collective method
    except ValueError:  # called from C++ on a thread with no Python above
        return False
    return caller.f_globals.get("__name__") == _TORCH_FUNCTIONS


def _single(tensors: Sequence[torch.Tensor], kind: str) -> torch.Tensor:
    if len(tensors) != 1:
        raise InvalidArgument(
            f"{kind} takes one tensor per process with the chorus backend, "
            f"got {len(tensors)}")
    return tensors[0]


class ProcessGroupChorus(dist.ProcessGroup):
    """A torch process group whose collectives run on one Chorus group.

    Made by create_process_group() when torch creates a "chorus" group;
    `communicator` is the chorus.Communicator underneath. CPU and CUDA
    tensors of float16, bfloat16, float32, float64, int8, uint8, int32 and
    int64 (CUDA ones staged, or unstaged where the communicator takes
    tensors of their GPU: chorus.torch._tensors);
    reduce ops SUM, PRODUCT, MIN, MAX and AVG. Work returned to
    torch.distributed's functions raises the chorus.Error of a failed call
    from wait(); see chorus.torch._work for the work C++ callers get.
    """

    def __init__(self, communicator: "chorus.Communicator") -> None:
        """Wraps a joined communicator: rank and size are its own."""
        super().__init__(communicator.rank, communicator.world_size)
        self._comm = communicator
        # The GPU whose tensors go to the communicator as they are.
        self._gpu = _tensors.gpu_of(communicator)

    @property
    def communicator(self) -> "chorus.Communicator":
        """The chorus.Communicator this group's collectives run on."""
        return self._comm

    @property
    def chorus_group(self) -> str:
        """The Chorus group's name."""
        return self._comm.group

    def getBackendName(self) -> str:  # noqa: N802 (torch's name)
        """The backend's name, "chorus"."""
        return BACKEND

    def __repr__(self) -> str:
        return (f"ProcessGroupChorus(group={self._comm.group!r}, "
                f"rank={self._comm.rank}, size={self._comm.world_size})")

    # --- plumbing -----------------------------------------------------------

    def _start(self, kind: str, from_python: bool,
               issue: Callable[[], "chorus.Work"], finish: Finish) -> Any:
        """Issues one Chorus call and returns the torch work completed by
        it. issue() raises at once for what the communicator refuses before
        the call takes a number.
        """
        _tensors.release_deferred()
        completion = Completion(kind)
        completion.attach(issue(), finish)
        return ChorusWork(completion) if from_python else cpp_work(completion)

    @property
    def _world(self) -> int:
        return self._comm.world_size

    def _pair_gpu(self, input: torch.Tensor,
                  output: torch.Tensor) -> Optional[int]:
        """The GPU a call of `input` into `output` runs on where they are
        (both on it, _tensors.on_gpu), else None: both are staged.
        """
        gpu = self._gpu
        both = _tensors.on_gpu(input, gpu) and _tensors.on_gpu(output, gpu)
        return gpu if both else None

    # --- collectives ------------------------------------------------------

    def allreduce(self, tensors: List[torch.Tensor],
                  opts: Any = None) -> Any:
        """all_reduce of one tensor, in place."""
        from_python = _called_from_torch_python()
        tensor = _single(tensors, "all_reduce")
        op = _reduce_op(opts.reduceOp if opts is not None else "SUM",
                        "all_reduce")
        staged = Staged(tensor, "all_reduce's tensor", gpu=self._gpu)

        def finish(_: Any) -> List[torch.Tensor]:
            staged.write_back()
            return [tensor]

        def issue() -> "chorus.Work":
            return self._comm.all_reduce(staged.array, op, out=staged.array,
                                         dtype=staged.dtype, async_op=True)

        return self._start("all_reduce", from_python, issue, finish)

    def broadcast(self, tensors: List[torch.Tensor],
                  opts: Any = None) -> Any:
        """broadcast of one tensor from opts.rootRank, in place."""
        from_python = _called_from_torch_python()
        tensor = _single(tensors, "broadcast")
        root = opts.rootRank if opts is not None else 0
        staged = Staged(tensor, "broadcast's tensor",
                        read=self._comm.rank == root, gpu=self._gpu)

        def finish(_: Any) -> List[torch.Tensor]:
            staged.write_back()
            return [tensor]

        def issue() -> "chorus.Work":
            return self._comm.broadcast(staged.array, root, out=staged.array,
                                        dtype=staged.dtype, async_op=True)

        return self._start("broadcast", from_python, issue, finish)

    def reduce(self, tensors: List[torch.Tensor], opts: Any = None) -> Any:
        """reduce of one tensor to opts.rootRank, in place there; the other
        ranks' tensors are left as they were.
        """
        from_python = _called_from_torch_python()
        tensor = _single(tensors, "reduce")
        root = opts.rootRank if opts is not None else 0
        op = _reduce_op(opts.reduceOp if opts is not None else "SUM",
                        "reduce")
        staged = Staged(tensor, "reduce's tensor", gpu=self._gpu)
        is_root = self._comm.rank == root

        def finish(_: Any) -> List[torch.Tensor]:
            if is_root:
                staged.write_back()
            return [tensor]

        def issue() -> "chorus.Work":
            return self._comm.reduce(staged.array, root, op,
                                     out=staged.array if is_root else None,
                                     dtype=staged.dtype, async_op=True)

        return self._start("reduce", from_python, issue, finish)

    def allgather(self, output_tensors: List[List[torch.Tensor]],
                  input_tensors: List[torch.Tensor],
                  opts: Any = None) -> Any:
        """all_gather into a list of world_size tensors."""
        from_python = _called_from_torch_python()
        tensor = _single(input_tensors, "all_gather")
        outputs = _single(output_tensors, "all_gather")
        self._check_outputs(outputs, tensor, "all_gather")
        staged = Staged(tensor, "all_gather's input")
        count = tensor.numel()
        flat = _tensors.flat_buffer(tensor, self._world * count)
        stream = _tensors.caller_stream(outputs[0])

        def finish(_: Any) -> List[torch.Tensor]:
            self._unpack(flat, outputs, count, stream)
            return outputs

        def issue() -> "chorus.Work":
            return self._comm.all_gather(staged.array,
                                         out=_tensors.numpy_view(flat),
                                         dtype=staged.dtype, async_op=True)

        return self._start("all_gather", from_python, issue, finish)

    def _allgather_base(self, output: torch.Tensor, input: torch.Tensor,
                        opts: Any = None) -> Any:
        """all_gather_into_tensor: rank i's input is block i of output."""
        from_python = _called_from_torch_python()
        gpu = self._pair_gpu(input, output)
        staged_in = Staged(input, "all_gather_into_tensor's input", gpu=gpu)
        self._check_size(output, self._world * input.numel(),
                         "all_gather_into_tensor's output",
                         "world_size x the input's")
        staged_out = Staged(output, "all_gather_into_tensor's output",
                            read=False, gpu=gpu)

        def finish(_: Any) -> List[torch.Tensor]:
            staged_out.write_back()
            return [output]

        def issue() -> "chorus.Work":
            return self._comm.all_gather(staged_in.array, out=staged_out.array,
                                         dtype=staged_in.dtype, async_op=True)

        return self._start("all_gather", from_python, issue, finish)

    def reduce_scatter(self, output_tensors: List[torch.Tensor],
                       input_tensors: List[List[torch.Tensor]],
                       opts: Any = None) -> Any:
        """reduce_scatter of a list of world_size tensors: this rank gets
        the reduction of every rank's tensor number `rank`.
        """
        from_python = _called_from_torch_python()
        output = _single(output_tensors, "reduce_scatter")
        inputs = _single(input_tensors, "reduce_scatter")
        op = _reduce_op(opts.reduceOp if opts is not None else "SUM",
                        "reduce_scatter")
        self._check_outputs(inputs, output, "reduce_scatter")
        stacked = _tensors.stack_blocks(inputs, "reduce_scatter's inputs",
                                        output.numel())
        staged_out = Staged(output, "reduce_scatter's output", read=False)

        def finish(_: Any) -> List[torch.Tensor]:
            staged_out.write_back()
            return [output]

        def issue() -> "chorus.Work":
            return self._comm.reduce_scatter(
                _tensors.numpy_view(stacked), op, out=staged_out.array,
                dtype=staged_out.dtype, async_op=True)

        return self._start("reduce_scatter", from_python, issue, finish)

    def _reduce_scatter_base(self, output: torch.Tensor, input: torch.Tensor,
                             opts: Any = None) -> Any:
        """reduce_scatter_tensor: this rank gets block `rank` of the
        reduction of every rank's input.
        """
        from_python = _called_from_torch_python()
        op = _reduce_op(opts.reduceOp if opts is not None else "SUM",
                        "reduce_scatter_tensor")
        self._check_size(input, self._world * output.numel(),
                         "reduce_scatter_tensor's input",
                         "world_size x the output's")
        gpu = self._pair_gpu(input, output)
        staged_in = Staged(input, "reduce_scatter_tensor's input", gpu=gpu)
        staged_out = Staged(output, "reduce_scatter_tensor's output",
                            read=False, gpu=gpu)

        def finish(_: Any) -> List[torch.Tensor]:
            staged_out.write_back()
            return [output]

        def issue() -> "chorus.Work":
            return self._comm.reduce_scatter(
                staged_in.array.reshape(self._world, -1), op,
                out=staged_out.array, dtype=staged_in.dtype,
                async_op=True)

        return self._start("reduce_scatter", from_python, issue, finish)

    def gather(self, output_tensors: List[List[torch.Tensor]],
               input_tensors: List[torch.Tensor], opts: Any = None) -> Any:
        """gather to opts.rootRank into its list of world_size tensors."""
        from_python = _called_from_torch_python()
        tensor = _single(input_tensors, "gather")
        root = opts.rootRank if opts is not None else 0
        is_root = self._comm.rank == root
        outputs: List[torch.Tensor] = []
        if is_root:
            outputs = _single(output_tensors, "gather")
            self._check_outputs(outputs, tensor, "gather")
        elif output_tensors:
            raise InvalidArgument(
                f"rank {self._comm.rank} is not the root of gather and must "
                "pass no gather_list")
        staged = Staged(tensor, "gather's input")
        count = tensor.numel()
        flat = (_tensors.flat_buffer(tensor, self._world * count)
                if is_root else None)
        stream = _tensors.caller_stream(outputs[0]) if outputs else None

        def finish(_: Any) -> List[torch.Tensor]:
            if flat is not None:
                self._unpack(flat, outputs, count, stream)
            return outputs

        def issue() -> "chorus.Work":
            return self._comm.gather(
                staged.array, root,
                out=None if flat is None else _tensors.numpy_view(flat),
                dtype=staged.dtype, async_op=True)

        return self._start("gather", from_python, issue, finish)

    def scatter(self, output_tensors: List[torch.Tensor],
                input_tensors: List[List[torch.Tensor]],
                opts: Any = None) -> Any:
        """scatter from opts.rootRank: rank i gets the root's tensor i."""
        from_python = _called_from_torch_python()
        output = _single(output_tensors, "scatter")
        root = opts.rootRank if opts is not None else 0
        is_root = self._comm.rank == root
        staged_out = Staged(output, "scatter's output", read=False)
        stacked = None
        if is_root:
            inputs = _single(input_tensors, "scatter")
            self._check_outputs(inputs, output, "scatter")
            stacked = _tensors.stack_blocks(inputs, "scatter's inputs",
                                            output.numel())
        elif input_tensors:
            raise InvalidArgument(
                f"rank {self._comm.rank} is not the root of scatter and "
                "must pass no scatter_list")
        count = output.numel()

        def finish(_: Any) -> List[torch.Tensor]:
            staged_out.write_back()
            return [output]

        def issue() -> "chorus.Work":
            if stacked is not None:
                return self._comm.scatter(
                    _tensors.numpy_view(stacked), root,
                    out=staged_out.array.reshape(-1),
                    dtype=staged_out.dtype, async_op=True)
            return self._comm.scatter(
                None, root, shape=(count,), out=staged_out.array.reshape(-1),
                dtype=staged_out.dtype, async_op=True)

        return self._start("scatter", from_python, issue, finish)

    def alltoall_base(self, output: torch.Tensor, input: torch.Tensor,
                      output_split_sizes: List[int],
                      input_split_sizes: List[int],
                      opts: Any = None) -> Any:
        """all_to_all_single. Without split sizes every rank sends and gets
        equal blocks of rows. With them (every rank passes them, or none),
        one more small collective first agrees on the largest block, which
        every block is padded to.
        """
        from_python = _called_from_torch_python()
        staged_in = Staged(input, "all_to_all_single's input")
        staged_out = Staged(output, "all_to_all_single's output", read=False)
        if staged_in.dtype != staged_out.dtype:
            raise InvalidArgument(
                f"all_to_all_single's input is {input.dtype} and its output "
                f"{output.dtype}")
        if not output_split_sizes and not input_split_sizes:
            self._check_size(output, input.numel(),
                             "all_to_all_single's output", "the input's")
            if input.numel() % self._world:
                raise InvalidArgument(
                    f"all_to_all_single's input of {input.numel()} elements "
                    f"does not split into {self._world} equal blocks; pass "
                    "split sizes")

            def finish(_: Any) -> List[torch.Tensor]:
                staged_out.write_back()
                return [output]

            def issue() -> "chorus.Work":
                return self._comm.all_to_all(
                    staged_in.array.reshape(self._world, -1),
                    out=staged_out.array, dtype=staged_in.dtype,
                    async_op=True)

            return self._start("all_to_all", from_python, issue, finish)
        return self._uneven_all_to_all(
            from_python, input, output, staged_in, staged_out,
            list(input_split_sizes), list(output_split_sizes))

    def _uneven_all_to_all(self, from_python: bool, input: torch.Tensor,
                           output: torch.Tensor, staged_in: Staged,
                           staged_out: Staged, input_splits: List[int],
                           output_splits: List[int]) -> Any:
        world = self._world
        rows_in = input.shape[0] if input.dim() else 1
        rows_out = output.shape[0] if output.dim() else 1
        row = input.numel() // rows_in if rows_in else 0
        out_row = output.numel() // rows_out if rows_out else 0
        input_splits = input_splits or [rows_in // world] * world
        output_splits = output_splits or [rows_out // world] * world
        for name, splits, rows in (("input", input_splits, rows_in),
                                   ("output", output_splits, rows_out)):
            if len(splits) != world or sum(splits) != rows or \
                    any(s < 0 for s in splits):
                raise InvalidArgument(
                    f"all_to_all_single's {name} split sizes {splits} must "
                    f"be {world} non-negative row counts adding up to the "
                    f"{name}'s {rows} rows")
        if rows_in and rows_out and row != out_row:
            raise InvalidArgument(
                f"all_to_all_single's input rows hold {row} elements and its "
                f"output rows {out_row}")
        row = row or out_row
        local = max(input_splits + output_splits) * row
        # Blocking: the all_to_all must take the next number on every rank.
        block = int(self._comm.all_reduce(
            np.array([local], np.int64), "max")[0])
        padded = torch.zeros((world, block), dtype=input.dtype)
        flat_in = staged_in.work.reshape(-1)
        at = 0
        for peer, rows in enumerate(input_splits):
            n = rows * row
            padded[peer, :n] = flat_in[at:at + n]
            at += n
        received = torch.empty((world, block), dtype=output.dtype)

        def finish(_: Any) -> List[torch.Tensor]:
            flat_out = staged_out.work.reshape(-1)
            at_out = 0
            for peer, rows in enumerate(output_splits):
                n = rows * row
                flat_out[at_out:at_out + n] = received[peer, :n]
                at_out += n
            staged_out.write_back()
            return [output]

        def issue() -> "chorus.Work":
            return self._comm.all_to_all(
                _tensors.numpy_view(padded),
                out=_tensors.numpy_view(received), dtype=staged_in.dtype,
                async_op=True)

        return self._start("all_to_all", from_python, issue, finish)

    def alltoall(self, output_tensors: List[torch.Tensor],
                 input_tensors: List[torch.Tensor], opts: Any = None) -> Any:
        """all_to_all of lists of world_size tensors of one size."""
        from_python = _called_from_torch_python()
        if len(input_tensors) != self._world:
            raise InvalidArgument(
                f"all_to_all takes {self._world} input tensors, got "
                f"{len(input_tensors)}")
        stacked = _tensors.stack_blocks(input_tensors, "all_to_all's inputs")
        count = stacked.shape[1]
        self._check_outputs(output_tensors, input_tensors[0], "all_to_all")
        flat = _tensors.flat_buffer(input_tensors[0], self._world * count)
        stream = _tensors.caller_stream(output_tensors[0])

        def finish(_: Any) -> List[torch.Tensor]:
            self._unpack(flat, output_tensors, count, stream)
            return output_tensors

        def issue() -> "chorus.Work":
            return self._comm.all_to_all(
                _tensors.numpy_view(stacked),
                out=_tensors.numpy_view(flat),
                dtype=_tensors.chorus_dtype(stacked, "all_to_all's inputs"),
                async_op=True)

        return self._start("all_to_all", from_python, issue, finish)

    def barrier(self, opts: Any = None) -> Any:
        """A Chorus barrier: done once every rank reached it."""
        from_python = _called_from_torch_python()
        return self._start("barrier", from_python, lambda: (
            self._comm.barrier(async_op=True)), lambda _: [])

    # --- what Chorus does not have ----------------------------------------

    def _no_point_to_point(self, name: str) -> Any:
        raise NotImplementedError(
            f"the chorus backend has no {name}: Chorus runs collectives "
            "only (all_reduce, broadcast, all_gather, reduce_scatter, reduce, "
            "gather, scatter, all_to_all, barrier)")

    def send(self, tensors: List[torch.Tensor], dst: int, tag: int = 0
             ) -> Any:
        """Refused: Chorus has no point-to-point messages."""
        return self._no_point_to_point("send")

    def recv(self, tensors: List[torch.Tensor], src: int, tag: int = 0
             ) -> Any:
        """Refused: Chorus has no point-to-point messages."""
        return self._no_point_to_point("recv")

    def recv_anysource(self, tensors: List[torch.Tensor], tag: int = 0
                       ) -> Any:
        """Refused: Chorus has no point-to-point messages."""
        return self._no_point_to_point("recv")

    # --- helpers ------------------------------------------------------------

    def _check_outputs(self, tensors: Sequence[torch.Tensor],
                       like: torch.Tensor, kind: str) -> None:
        """Checks that a list holds world_size tensors of `like`'s dtype and
        element count.
        """
        if len(tensors) != self._world:
            raise InvalidArgument(
                f"{kind} takes a list of {self._world} tensors (one per "
                f"rank), got {len(tensors)}")
        for i, t in enumerate(tensors):
            _tensors.chorus_dtype(t, f"{kind}'s tensor {i}")
            if t.dtype != like.dtype or t.numel() != like.numel():
                raise InvalidArgument(
                    f"{kind}'s tensor {i} is {t.dtype}[{t.numel()}] where "
                    f"{like.dtype}[{like.numel()}] is expected; Chorus moves "
                    "blocks of one size and dtype")

    @staticmethod
    def _check_size(tensor: torch.Tensor, elements: int, what: str,
                    expected: str) -> None:
        if tensor.numel() != elements:
            raise InvalidArgument(
                f"{what} has {tensor.numel()} elements; it must have "
                f"{expected} ({elements})")

    @staticmethod
    def _unpack(flat: torch.Tensor, outputs: Sequence[torch.Tensor],
                count: int, stream: Optional[Any]) -> None:
        """Copies block i of `flat` into outputs[i]; into CUDA tensors, on
        `stream` (the outputs' caller_stream when the call was issued):
        `flat` goes to the device in one copy that torch keeps its pinned
        memory alive for, and the blocks are copied from there.
        """
        with torch.no_grad(), _tensors.on_stream(stream):
            if stream is not None:
                flat = flat.to(outputs[0].device, non_blocking=True)
            for i, t in enumerate(outputs):
                t.copy_(flat[i * count:(i + 1) * count].view(t.shape))
