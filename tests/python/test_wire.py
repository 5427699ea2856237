"""The client against a stand-in WorkerLocal server in this process: what
each call puts on the wire, and how statuses (with and without
google.rpc.Status details) become exceptions.
"""

import threading
from concurrent import futures
from typing import Any, Callable, Dict, Iterator, List, Optional

import grpc
import numpy as np
import pytest

import chorus
from chorus import _status_details
from chorus.v1 import types_pb2, worker_pb2, worker_pb2_grpc

EPOCH = 77


class StandIn(worker_pb2_grpc.WorkerLocalServicer):
    """Records every request; answers collectives with `answer`."""

    def __init__(self) -> None:
        self.requests: List[worker_pb2.LocalCollectiveRequest] = []
        self.lock = threading.Lock()
        self.answer: Optional[Callable[[Any, Any], Any]] = None

    def JoinGroup(self, request: Any, context: Any) -> Any:
        return worker_pb2.LocalJoinResponse(
            epoch=EPOCH, world_size=request.world_size,
            member_devices=["Cpu"] * request.world_size)

    def Collective(self, request: Any, context: Any) -> Any:
        with self.lock:
            self.requests.append(request)
        if self.answer is not None:
            return self.answer(request, context)
        return worker_pb2.LocalCollectiveResponse(
            sequence=request.sequence, data=b"\0" * expected_output(request))


def expected_output(request: Any) -> int:
    """Output bytes of a request to a rank 1 of 2 (server rules)."""
    size = {types_pb2.DTYPE_F16: 2, types_pb2.DTYPE_BF16: 2,
            types_pb2.DTYPE_F32: 4, types_pb2.DTYPE_F64: 8,
            types_pb2.DTYPE_I8: 1, types_pb2.DTYPE_U8: 1,
            types_pb2.DTYPE_I32: 4, types_pb2.DTYPE_I64: 8,
            types_pb2.DTYPE_U32: 4, types_pb2.DTYPE_U64: 8}.get(
                request.spec.dtype, 0)
    block = request.spec.count * size
    k = request.spec.kind
    if k in (types_pb2.COLLECTIVE_KIND_ALL_GATHER,
             types_pb2.COLLECTIVE_KIND_ALL_TO_ALL):
        return 2 * block
    if k == types_pb2.COLLECTIVE_KIND_REDUCE:
        return block if request.rank == request.spec.root else 0
    if k == types_pb2.COLLECTIVE_KIND_GATHER:
        return 2 * block if request.rank == request.spec.root else 0
    if k == types_pb2.COLLECTIVE_KIND_BARRIER:
        return 0
    return block


@pytest.fixture
def stand_in() -> Iterator[Any]:
    servicer = StandIn()
    server = grpc.server(futures.ThreadPoolExecutor(4))
    worker_pb2_grpc.add_WorkerLocalServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    comm = chorus.join("wire", 2, 1, worker=f"127.0.0.1:{port}", timeout=10)
    yield servicer, comm
    comm.close()
    server.stop(None)


def test_requests_carry_numbers_epoch_counts_and_data(stand_in: Any) -> None:
    servicer, comm = stand_in
    x = np.arange(6, dtype=np.float32)
    comm.all_reduce(x, op="max")
    comm.reduce_scatter(x.reshape(2, 3))
    comm.broadcast(root=0, shape=(2, 3), dtype="i64")
    comm.scatter(root=0, shape=3, dtype="u8")
    comm.gather(x, root=0)
    comm.all_to_all(x.astype(np.int8))
    comm.all_gather(np.zeros(2, np.uint16), dtype="bf16")
    comm.barrier()
    kinds = [r.spec.kind for r in servicer.requests]
    assert kinds == [types_pb2.COLLECTIVE_KIND_ALL_REDUCE,
                     types_pb2.COLLECTIVE_KIND_REDUCE_SCATTER,
                     types_pb2.COLLECTIVE_KIND_BROADCAST,
                     types_pb2.COLLECTIVE_KIND_SCATTER,
                     types_pb2.COLLECTIVE_KIND_GATHER,
                     types_pb2.COLLECTIVE_KIND_ALL_TO_ALL,
                     types_pb2.COLLECTIVE_KIND_ALL_GATHER,
                     types_pb2.COLLECTIVE_KIND_BARRIER]
    assert [r.sequence for r in servicer.requests] == list(range(1, 9))
    assert all(r.epoch == EPOCH and r.group == "wire" and r.rank == 1
               for r in servicer.requests)
    # count: the whole buffer, or one rank's block.
    assert [r.spec.count for r in servicer.requests] == \
        [6, 3, 6, 3, 6, 3, 2, 0]
    assert servicer.requests[0].spec.op == types_pb2.REDUCE_OP_MAX
    assert servicer.requests[0].data == x.tobytes()
    assert servicer.requests[1].spec.op == types_pb2.REDUCE_OP_SUM
    # Off the root, broadcast and scatter send nothing.
    assert servicer.requests[2].data == b"" == servicer.requests[3].data
    assert servicer.requests[2].spec.dtype == types_pb2.DTYPE_I64
    assert servicer.requests[6].spec.dtype == types_pb2.DTYPE_BF16
    assert servicer.requests[7].data == b""


def test_repeated_calls_carry_their_own_number_and_data(
        stand_in: Any) -> None:
    servicer, comm = stand_in
    for i in range(3):
        comm.all_reduce(np.full(4, i, np.float32))
        comm.all_reduce(np.full(4, i + 10, np.float32), op="max")
        comm.all_reduce(np.full(5, i, np.int32))
    requests = servicer.requests
    assert [r.sequence for r in requests] == list(range(1, 10))
    assert all(r.epoch == EPOCH and r.group == "wire" and r.rank == 1
               for r in requests)
    for i in range(3):
        plain, top, ints = requests[3 * i:3 * i + 3]
        assert plain.spec.op == types_pb2.REDUCE_OP_SUM
        assert plain.spec.count == 4
        assert plain.data == np.full(4, i, np.float32).tobytes()
        assert top.spec.op == types_pb2.REDUCE_OP_MAX
        assert top.data == np.full(4, i + 10, np.float32).tobytes()
        assert ints.spec.dtype == types_pb2.DTYPE_I32
        assert ints.spec.count == 5
        assert ints.data == np.full(5, i, np.int32).tobytes()


def test_non_roots_get_none(stand_in: Any) -> None:
    _, comm = stand_in
    assert comm.reduce(np.ones(3, np.float64), root=0) is None
    assert comm.gather(np.ones(3, np.float64), root=0) is None
    assert comm.reduce(np.ones(3, np.float64), root=1).shape == (3,)
    assert comm.gather(np.ones(3, np.float64), root=1).shape == (2, 3)


CODES = {
    grpc.StatusCode.INVALID_ARGUMENT: chorus.InvalidArgument,
    grpc.StatusCode.DEADLINE_EXCEEDED: chorus.DeadlineExceeded,
    grpc.StatusCode.ABORTED: chorus.Aborted,
    grpc.StatusCode.FAILED_PRECONDITION: chorus.FailedPrecondition,
    grpc.StatusCode.UNIMPLEMENTED: chorus.Unimplemented,
    grpc.StatusCode.UNAVAILABLE: chorus.Unavailable,
    grpc.StatusCode.NOT_FOUND: chorus.NotFound,
    grpc.StatusCode.RESOURCE_EXHAUSTED: chorus.ResourceExhausted,
    grpc.StatusCode.DATA_LOSS: chorus.DataLoss,
    grpc.StatusCode.PERMISSION_DENIED: chorus.PermissionDenied,
    grpc.StatusCode.UNAUTHENTICATED: chorus.Unauthenticated,
    grpc.StatusCode.INTERNAL: chorus.Internal,
    grpc.StatusCode.UNKNOWN: chorus.Error,
}


def _fail(code: grpc.StatusCode, message: str,
          details: Optional[bytes] = None) -> Callable[[Any, Any], Any]:
    def answer(request: Any, context: Any) -> Any:
        if details is not None:
            context.set_trailing_metadata(
                [(_status_details.DETAILS_KEY, details)])
        context.abort(code, message)
    return answer


@pytest.mark.parametrize("code", list(CODES), ids=lambda c: c.name)
def test_each_code_has_its_class(stand_in: Any,
                                 code: grpc.StatusCode) -> None:
    servicer, comm = stand_in
    servicer.answer = _fail(code, f"something {code.name}")
    work = comm.all_reduce(np.ones(1, np.float32), async_op=True)
    error = work.exception(timeout=10)
    assert type(error) is CODES[code]
    assert error.code == code and error.message == f"something {code.name}"
    assert error.sequence == work.sequence and error.group == "wire"
    assert str(error) == f"{code.name}: something {code.name}"
    with pytest.raises(CODES[code]):
        comm.all_reduce(np.ones(1, np.float32))


def test_a_status_without_details_has_only_its_code_and_message(
        stand_in: Any) -> None:
    servicer, comm = stand_in
    message = ('group g (epoch 12) aborted: ranks 0, 2-3 on worker "w 1" '
               "(id 3) lost: no heartbeat within the lease (5s); join the "
               "group again")
    servicer.answer = _fail(grpc.StatusCode.ABORTED, message)
    with pytest.raises(chorus.Aborted) as caught:
        comm.barrier()
    e = caught.value
    assert e.message == message and e.details == []
    # The message text is not parsed: the facts come from an ErrorDetail.
    assert (e.epoch, e.lost_worker, e.lost_worker_id, e.lost_ranks,
            e.lost_rank, e.missing_ranks, e.reason) == (
                None, None, None, None, None, None, None)
    # A failed collective names its own group and number at least.
    assert e.group == "wire" and e.sequence == comm.next_sequence - 1


def test_details_win_over_the_message(stand_in: Any) -> None:
    servicer, comm = stand_in
    info = _status_details.error_info(
        "MISSING_RANKS", "chorus",
        {"missing_ranks": "5, 7-8", "sequence": "9", "group": "from-details"})
    servicer.answer = _fail(
        grpc.StatusCode.DEADLINE_EXCEEDED,
        "rank 2 of group g did not reach all_reduce #1 within the deadline",
        _status_details.encode(grpc.StatusCode.DEADLINE_EXCEEDED.value[0],
                               "the status's own message", [info]))
    with pytest.raises(chorus.DeadlineExceeded) as caught:
        comm.all_reduce(np.ones(1, np.float32))
    e = caught.value
    assert e.missing_ranks == [5, 7, 8]
    assert e.sequence == 9 and e.group == "from-details"
    assert e.reason == "MISSING_RANKS"
    assert e.message == "the status's own message"
    assert e.details[0][0] == "google.rpc.ErrorInfo"


def test_details_of_a_known_message_type(stand_in: Any) -> None:
    servicer, comm = stand_in
    # Any message the default descriptor pool knows is unpacked by field
    # name; GroupAbort has "group" and "epoch".
    from chorus.v1 import coordinator_pb2
    detail = coordinator_pb2.GroupAbort(group="gx", epoch=42)
    servicer.answer = _fail(
        grpc.StatusCode.ABORTED, "aborted",
        _status_details.encode(grpc.StatusCode.ABORTED.value[0], "aborted",
                               [detail]))
    with pytest.raises(chorus.Aborted) as caught:
        comm.barrier()
    assert caught.value.group == "gx" and caught.value.epoch == 42


def test_malformed_details_are_ignored(stand_in: Any) -> None:
    servicer, comm = stand_in
    message = ("collective #4 of group g does not match across ranks: "
               "ranks 0, 1: all_reduce f32[3] sum; rank 2: all_reduce "
               "f32[2] sum")
    servicer.answer = _fail(grpc.StatusCode.INVALID_ARGUMENT, message,
                            b"\xff\xff not a status")
    with pytest.raises(chorus.InvalidArgument) as caught:
        comm.barrier()
    assert caught.value.message == message and caught.value.details == []
    assert caught.value.ranks is None and caught.value.reason is None
    assert caught.value.sequence == comm.next_sequence  # given back


def test_a_workers_stale_epoch_refusal_names_its_epoch_and_group() -> None:
    # A worker's refusal of a call in an epoch it left behind carries a
    # STALE_EPOCH detail; without one the text alone says nothing.
    from chorus.v1 import status_pb2
    message = "stale epoch 3 for group g/1; this worker joined it at epoch 4"
    detail = status_pb2.ErrorDetail(reason="STALE_EPOCH", group="g/1",
                                    epoch=3)
    code = grpc.StatusCode.FAILED_PRECONDITION
    error = chorus.errors.from_rpc_error(chorus._call_socket.CallSocketError(
        code, message,
        _status_details.encode(code.value[0], message, [detail])))
    assert type(error) is chorus.FailedPrecondition
    assert (error.epoch, error.group) == (3, "g/1")
    assert error.reason == "STALE_EPOCH"
    bare = chorus.errors.from_rpc_error(
        chorus._call_socket.CallSocketError(code, message))
    assert (bare.epoch, bare.group) == (None, None)


def test_a_short_reply_is_an_internal_error(stand_in: Any) -> None:
    servicer, comm = stand_in
    servicer.answer = lambda request, context: \
        worker_pb2.LocalCollectiveResponse(data=b"\0" * 3)
    with pytest.raises(chorus.Internal) as caught:
        comm.all_reduce(np.ones(2, np.float32))
    assert "returned 3 bytes" in caught.value.message


def test_errors_survive_pickling() -> None:
    import pickle
    from chorus.v1 import status_pb2
    message = ("ranks 1, 2 of group g did not reach barrier #3 within the "
               "deadline")
    detail = status_pb2.ErrorDetail(reason="RANKS_MISSING", group="g",
                                    sequence=3, missing_ranks=[1, 2])
    decoded = _status_details.decode([(
        _status_details.DETAILS_KEY,
        _status_details.encode(grpc.StatusCode.DEADLINE_EXCEEDED.value[0],
                               message, [detail]))])
    assert decoded is not None
    error = chorus.DeadlineExceeded(
        message, grpc.StatusCode.DEADLINE_EXCEEDED, decoded[2])
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is chorus.DeadlineExceeded
    assert copy.missing_ranks == [1, 2] and copy.sequence == 3
    assert copy.reason == "RANKS_MISSING" and copy.group == "g"


def test_a_deadline_without_a_verdict_names_the_call(stand_in: Any) -> None:
    servicer, comm = stand_in
    answered = threading.Event()

    def late(request: Any, context: Any) -> Any:
        answered.wait(10)  # until the client gave up
        return worker_pb2.LocalCollectiveResponse()

    servicer.answer = late
    try:
        with pytest.raises(chorus.DeadlineExceeded) as caught:
            comm.barrier(timeout=0.3)
    finally:
        answered.set()
    assert caught.value.message == (
        f"barrier #{caught.value.sequence} of group wire got no answer from "
        f"the worker daemon at {comm.worker} within its deadline")


@pytest.mark.parametrize("region,offset,size", [
    (1, 0, 0), (7, 4096, 297988), ((1 << 63) + 5, (1 << 40) + 1, 1 << 33)])
def test_shared_buffer_fields_parse_as_the_protos_say(
        region: int, offset: int, size: int) -> None:
    from chorus import _wire
    prefix = worker_pb2.LocalCollectiveRequest(
        group="g", rank=1, epoch=EPOCH,
        spec=types_pb2.CollectiveSpec(
            kind=types_pb2.COLLECTIVE_KIND_ALL_REDUCE, count=3)
    ).SerializeToString()
    wire = b"".join((
        prefix,
        _wire.shared_buffer(_wire.SHARED_INPUT_TAG, region, offset, size),
        _wire.shared_buffer(_wire.SHARED_OUTPUT_TAG, region + 1, offset + 2,
                            size + 3),
        _wire.SEQUENCE_TAG, _wire.varint(9)))
    request = worker_pb2.LocalCollectiveRequest.FromString(wire)
    assert (request.shared_input.region, request.shared_input.offset,
            request.shared_input.bytes) == (region, offset, size)
    assert (request.shared_output.region, request.shared_output.offset,
            request.shared_output.bytes) == (region + 1, offset + 2, size + 3)
    assert (request.group, request.rank, request.sequence) == ("g", 1, 9)
    assert request.spec.count == 3
