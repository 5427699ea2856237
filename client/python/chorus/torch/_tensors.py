"""torch tensors as the numpy views the Chorus communicator reads and
writes, without copies where the tensor allows it.

Chorus moves host memory of ten element types; torch has eight of them
(torch 1.13 has no uint32 or uint64). bfloat16 travels as its 16-bit
patterns: the view is int16, sent with dtype "bf16".

A CUDA tensor is staged through pinned host memory once each way, ordered
on torch's current stream of its device as the collective was issued: the
copy to the host follows the kernels that wrote the tensor (the issuing
thread waits for that stream), and the result goes back with a copy
enqueued on that same stream, so kernels the caller enqueues there after
the work completed see it.

Where the rank embeds the worker runtime and joined on the tensor's GPU
(Communicator.device_arrays), a contiguous CUDA tensor is not staged here:
the communicator gets it as an array in GPU memory (CudaView), and the
worker's device path reads and writes it where it is, ordered on that same
stream without the issuing thread waiting for it.
"""

import contextlib
from typing import Any, ContextManager, Dict, List, Optional

import numpy as np
import torch

from chorus._names import parse_device
from chorus.errors import InvalidArgument

_CHORUS_DTYPES: Dict[torch.dtype, str] = {
    torch.float16: "f16",
    torch.bfloat16: "bf16",
    torch.float32: "f32",
    torch.float64: "f64",
    torch.int8: "i8",
    torch.uint8: "u8",
    torch.int32: "i32",
    torch.int64: "i64",
}
for _name, _chorus in (("uint32", "u32"), ("uint64", "u64")):
    if hasattr(torch, _name):  # newer torch releases have them
        _CHORUS_DTYPES[getattr(torch, _name)] = _chorus


# The devices whose tensors the backend takes.
_DEVICE_TYPES = ("cpu", "cuda")


def chorus_dtype(tensor: torch.Tensor, what: str) -> str:
    """Returns the Chorus dtype name of `tensor`'s elements, or raises
    InvalidArgument for a tensor Chorus cannot move: neither on the CPU
    nor on a CUDA device, not dense, or of a dtype Chorus does not have
    (bool, int16, complex is viewed as real by torch before it gets here).
    """
    if not isinstance(tensor, torch.Tensor):
        raise InvalidArgument(
            f"{what} must be a torch.Tensor, got {type(tensor).__name__}")
    if tensor.device.type not in _DEVICE_TYPES:
        raise InvalidArgument(
            f"{what} is on {tensor.device}; the chorus backend takes CPU "
            "and CUDA tensors (move it with .cpu())")
    if tensor.layout != torch.strided:
        raise InvalidArgument(
            f"{what} has layout {tensor.layout}; the chorus backend takes "
            "dense (strided) tensors")
    name = _CHORUS_DTYPES.get(tensor.dtype)
    if name is None:
        have = ", ".join(str(d).replace("torch.", "") for d in _CHORUS_DTYPES)
        raise InvalidArgument(
            f"{what} has dtype {tensor.dtype}, which Chorus does not have; "
            f"the chorus backend takes {have}")
    return name


# Tensors whose last numpy view the communicator let go of, kept until a
# caller's thread drops them (release_deferred).
_DEFERRED: List[np.ndarray] = []


class _Memory:
    """A tensor's memory as a numpy array interface whose end hands the
    tensor to _DEFERRED instead of dropping it.

    The communicator lets go of its arrays on gRPC's daemon threads. Ending
    the last reference to a tensor there runs torch code, which aborts the
    process if the interpreter is shutting down meanwhile (torch's C++ code
    is unwound when that thread takes the GIL back); see
    chorus.torch._work._InFlight for the rest of that story.
    """

    __slots__ = ("_array", "__array_interface__")

    def __init__(self, array: np.ndarray) -> None:
        self._array = array
        self.__array_interface__ = array.__array_interface__

    def __del__(self, _deferred: List[np.ndarray] = _DEFERRED) -> None:
        # The list comes as a default: it outlives this module's globals.
        _deferred.append(self._array)


def release_deferred() -> None:
    """Drops, on the calling thread, the tensors the communicator let go
    of. Called where collectives are issued and at exit.
    """
    _DEFERRED.clear()


def numpy_view(tensor: torch.Tensor) -> np.ndarray:
    """Returns a writable numpy array sharing `tensor`'s memory (int16 for
    bfloat16), whose end never ends the tensor (see _Memory). The tensor
    must be contiguous and on the CPU.
    """
    plain = tensor.detach()
    if plain.dtype == torch.bfloat16:
        plain = plain.view(torch.int16)
    return np.asarray(_Memory(plain.numpy()))


def caller_stream(tensor: torch.Tensor) -> Optional[Any]:
    """torch's current stream on a CUDA tensor's device, which the
    collective is ordered on; None for a CPU tensor.
    """
    if tensor.device.type != "cuda":
        return None
    return torch.cuda.current_stream(tensor.device)


def on_stream(stream: Optional[Any]) -> ContextManager[Any]:
    """A context in which torch enqueues on `stream` (from caller_stream);
    nothing changes for None.
    """
    if stream is None:
        return contextlib.nullcontext()
    return torch.cuda.stream(stream)


def host_tensor(like: torch.Tensor, shape: Any) -> torch.Tensor:
    """Returns a new contiguous CPU tensor of `shape` and `like`'s dtype,
    pinned when `like` is on a CUDA device (copies from and to it then run
    asynchronously, and once each way).
    """
    return torch.empty(shape, dtype=like.dtype, device="cpu",
                       pin_memory=like.device.type == "cuda")


def host_copy(tensor: torch.Tensor) -> torch.Tensor:
    """Returns `tensor` when it is a contiguous CPU tensor; otherwise a
    contiguous CPU copy of it. A CUDA tensor is copied into pinned memory
    on its device's current stream, which this thread then waits for: the
    copy sees what the kernels enqueued before it wrote.
    """
    plain = tensor.detach()
    if tensor.device.type != "cuda":
        return plain if plain.is_contiguous() else plain.contiguous()
    host = host_tensor(tensor, tensor.shape)
    stream = caller_stream(tensor)
    with on_stream(stream):
        host.copy_(plain, non_blocking=True)
    stream.synchronize()
    return host


def gpu_of(communicator: Any) -> Optional[int]:
    """The index n of the GPU Cuda(n) whose tensors `communicator` takes as
    they are (Communicator.device_arrays); None where it takes host memory
    only.
    """
    if not communicator.device_arrays:
        return None
    return parse_device(communicator.device).index


def on_gpu(tensor: torch.Tensor, gpu: Optional[int]) -> bool:
    """Whether `tensor` is a contiguous tensor of GPU `gpu` (None: no GPU),
    which a collective then reads and writes where it is.
    """
    return (gpu is not None and tensor.device.type == "cuda" and
            tensor.device.index == gpu and tensor.is_contiguous())


class CudaView:
    """A CUDA tensor as the communicator takes an array in GPU memory: its
    __cuda_array_interface__ (bfloat16 as int16), whose stream is the one
    the collective is ordered on. Its end hands the tensor to _DEFERRED, as
    _Memory's does.
    """

    __slots__ = ("_tensor", "_stream")

    def __init__(self, tensor: torch.Tensor, stream: Any) -> None:
        """Views `tensor` (contiguous, on a GPU), ordered on torch stream
        `stream`.
        """
        plain = tensor.detach()
        if plain.dtype == torch.bfloat16:
            plain = plain.view(torch.int16)
        self._tensor = plain
        # The interface's 1 is the legacy default stream, whose handle
        # torch gives as 0 (which the interface does not allow).
        self._stream = stream.cuda_stream or 1

    @property
    def __cuda_array_interface__(self) -> Dict[str, Any]:
        interface = dict(self._tensor.__cuda_array_interface__)
        interface["stream"] = self._stream
        return interface

    def reshape(self, *shape: int) -> "CudaView":
        """The same memory as another shape."""
        view = CudaView.__new__(CudaView)
        view._tensor = self._tensor.view(*shape)
        view._stream = self._stream
        return view

    def __del__(self, _deferred: List[Any] = _DEFERRED) -> None:
        _deferred.append(self._tensor)


class Staged:
    """One tensor a collective reads or writes, staged for the communicator.

    `array` is a numpy view of the tensor itself when it is a contiguous
    CPU tensor, a CudaView of it when the communicator takes it where it is
    (on_gpu), and a numpy view of a contiguous host copy otherwise (pinned
    for a CUDA tensor); write_back() copies such a copy into the tensor
    once the collective wrote it. `dtype` is the Chorus dtype name; `stream`
    the CUDA stream the tensor's copies are ordered on (None on the CPU).
    """

    def __init__(self, tensor: torch.Tensor, what: str,
                 read: bool = True, gpu: Optional[int] = None) -> None:
        """Stages `tensor`; `read` says whether the collective reads its
        contents (an output-only tensor that needs a host copy is not
        copied in). A tensor on_gpu(tensor, gpu) is not staged: `array` is
        a CudaView of it.
        """
        self.dtype: str = chorus_dtype(tensor, what)
        self.tensor: torch.Tensor = tensor
        self.stream: Optional[Any] = caller_stream(tensor)
        self.array: Any
        if on_gpu(tensor, gpu):
            self.work: torch.Tensor = tensor
            self.array = CudaView(tensor, self.stream)
        elif tensor.device.type == "cpu" and tensor.is_contiguous():
            self.work = tensor
            self.array = numpy_view(tensor)
        else:
            self.work = (host_copy(tensor) if read else
                         host_tensor(tensor, tensor.shape))
            self.array = numpy_view(self.work)

    def write_back(self) -> None:
        """Copies the staged result into the tensor, where it was staged in
        a copy: for a CUDA tensor, enqueued on `stream` without waiting.
        """
        if self.work is not self.tensor:
            with torch.no_grad(), on_stream(self.stream):
                self.tensor.copy_(self.work,
                                  non_blocking=self.stream is not None)


def flat_buffer(like: torch.Tensor, elements: int) -> torch.Tensor:
    """Returns a new contiguous 1-D CPU tensor of `elements` elements of
    `like`'s dtype (pinned when `like` is on a CUDA device).
    """
    return host_tensor(like, (elements,))


def stack_blocks(tensors: List[torch.Tensor], what: str,
                 block: Optional[int] = None) -> torch.Tensor:
    """Returns the tensors' elements one after the other in a new
    contiguous CPU tensor of shape (len(tensors), block), checking that
    they share a dtype and each holds `block` elements (the first one's
    count when None).
    """
    if not tensors:
        raise InvalidArgument(f"{what} is empty")
    first = tensors[0]
    name = chorus_dtype(first, f"{what}[0]")
    if block is None:
        block = first.numel()
    for i, t in enumerate(tensors):
        if chorus_dtype(t, f"{what}[{i}]") != name:
            raise InvalidArgument(
                f"{what} mixes dtypes: {what}[0] is {first.dtype}, "
                f"{what}[{i}] is {t.dtype}")
        if t.numel() != block:
            raise InvalidArgument(
                f"{what}[{i}] has {t.numel()} elements where the others "
                f"have {block}; Chorus moves blocks of one size")
    with torch.no_grad():
        return host_copy(torch.stack([t.detach().reshape(-1)
                                      for t in tensors]))
