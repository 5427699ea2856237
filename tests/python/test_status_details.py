"""What a client written from the protos alone reads from a real worker's
errors: the google.rpc.Status in the trailing metadata entry
"grpc-status-details-bin", holding a chorus.v1.ErrorDetail. Nothing of the
chorus package's own error handling is used here, only generated stubs.
"""

import threading
from typing import Any, List, Optional

import grpc
import pytest

from chorus.v1 import status_pb2, types_pb2, worker_pb2, worker_pb2_grpc
from conftest import CALL_TIMEOUT, Cluster, unique_group

DETAIL_URL = "type.googleapis.com/chorus.v1.ErrorDetail"


def error_detail(error: grpc.RpcError) -> status_pb2.ErrorDetail:
    """The ErrorDetail of `error`'s google.rpc.Status; fails the test when
    there is none."""
    for key, value in error.trailing_metadata() or ():
        if key == "grpc-status-details-bin":
            status = status_pb2.RpcStatus.FromString(value)
            assert status.code == error.code().value[0]
            assert status.message == error.details()
            for packed in status.details:
                if packed.type_url == DETAIL_URL:
                    return status_pb2.ErrorDetail.FromString(packed.value)
    pytest.fail(f"no ErrorDetail on {error.code()}: {error.details()}")


def test_refused_device_detail_names_it(cluster: Cluster) -> None:
    with grpc.insecure_channel(cluster.address("w0")) as channel:
        stub = worker_pb2_grpc.WorkerLocalStub(channel)
        with pytest.raises(grpc.RpcError) as caught:
            stub.JoinGroup(worker_pb2.LocalJoinRequest(
                group=unique_group(), world_size=1, rank=0,
                device=types_pb2.Device(kind=types_pb2.DEVICE_KIND_VULKAN)),
                timeout=CALL_TIMEOUT)
    assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED
    detail = error_detail(caught.value)
    assert detail.reason == "DEVICE_UNSUPPORTED"
    assert detail.device == "Vulkan(0)"


def test_mismatch_detail_holds_each_ranks_call(cluster: Cluster) -> None:
    group = unique_group()
    addresses = [cluster.address("w0"), cluster.address("w1")]
    channels = [grpc.insecure_channel(a) for a in addresses]
    stubs = [worker_pb2_grpc.WorkerLocalStub(c) for c in channels]
    epochs: List[Optional[int]] = [None, None]
    errors: List[Optional[grpc.RpcError]] = [None, None]

    def rank(r: int) -> None:
        epochs[r] = stubs[r].JoinGroup(worker_pb2.LocalJoinRequest(
            group=group, world_size=2, rank=r), timeout=CALL_TIMEOUT).epoch
        count = 3 if r == 0 else 2
        try:
            stubs[r].Collective(worker_pb2.LocalCollectiveRequest(
                group=group, rank=r, epoch=epochs[r], sequence=1,
                spec=types_pb2.CollectiveSpec(
                    kind=types_pb2.COLLECTIVE_KIND_ALL_REDUCE,
                    dtype=types_pb2.DTYPE_F32, count=count,
                    op=types_pb2.REDUCE_OP_SUM),
                data=b"\0" * (4 * count)), timeout=CALL_TIMEOUT)
        except grpc.RpcError as error:
            errors[r] = error

    threads = [threading.Thread(target=rank, args=(r,)) for r in (0, 1)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(CALL_TIMEOUT * 3)
    finally:
        for c in channels:
            c.close()
    for error in errors:
        assert error is not None
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        detail: Any = error_detail(error)
        assert detail.reason == "MISMATCH"
        assert detail.group == group
        assert detail.epoch == epochs[0]
        assert detail.sequence == 1
        assert dict(detail.ranks) == {0: "all_reduce f32[3] sum",
                                      1: "all_reduce f32[2] sum"}
