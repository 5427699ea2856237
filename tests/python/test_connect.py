"""How a rank reaches its worker daemon: the worker's Unix socket (named, or
the default one), and its TCP address with mutual TLS, against real
daemons; and TLS directories that are refused before anything is sent.
"""

import os
import shutil
import stat
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any, Dict, Iterator

import grpc
import numpy as np
import pytest

import chorus
from conftest import (CALL_TIMEOUT, Cluster, join_all, make_certs,
                      run_ranks, short_temp_dir, unique_group)

NOWHERE = "127.0.0.1:1"  # nothing is sent there: the checks come first


def _all_reduce_pair(comms: Any) -> None:
    """Two ranks all-reduce and both get the sum."""
    got = run_ranks([
        (lambda c=c: c.all_reduce(np.arange(4, dtype=np.float32) *
                                  (c.rank + 1)))
        for c in comms])
    for g in got:
        np.testing.assert_array_equal(g, [0.0, 3.0, 6.0, 9.0])


def _close(comms: Any) -> None:
    for comm in comms:
        comm.close()


# --- Unix sockets ------------------------------------------------------------


def test_rank_joins_through_a_unix_socket(cluster: Cluster,
                                          socket_dir: Path) -> None:
    path = str(socket_dir / "w.sock")
    worker = cluster.add_worker(f"unix-{uuid.uuid4().hex[:8]}",
                                local_socket=path)
    try:
        # Only the user running the worker may connect.
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        comms = join_all([f"unix:{path}", cluster.address("w1")])
        try:
            assert comms[0].worker == f"unix:{path}"
            _all_reduce_pair(comms)
        finally:
            _close(comms)
    finally:
        worker.stop()


@pytest.mark.parametrize("local_socket", [None, "default"],
                         ids=["no flag", "--local_socket=default"])
def test_rank_joins_through_the_default_socket(
        cluster: Cluster, socket_dir: Path, monkeypatch: pytest.MonkeyPatch,
        local_socket: Any) -> None:
    env = dict(os.environ, XDG_RUNTIME_DIR=str(socket_dir))
    worker = cluster.add_worker(f"default-{uuid.uuid4().hex[:8]}",
                                local_socket=local_socket, env=env)
    try:
        expected = f"{socket_dir}/chorus/worker.sock"
        assert worker.local_socket == expected
        assert os.path.exists(expected)
        monkeypatch.setenv("XDG_RUNTIME_DIR", str(socket_dir))
        monkeypatch.delenv("CHORUS_WORKER", raising=False)
        monkeypatch.delenv("CHORUS_TLS_DIR", raising=False)
        assert chorus.default_socket_path() == expected
        group = unique_group()
        comms = run_ranks([
            lambda: chorus.join(group, 2, 0, timeout=CALL_TIMEOUT),
            lambda: chorus.join(group, 2, 1, worker=cluster.address("w1"),
                                timeout=CALL_TIMEOUT)])
        try:
            assert comms[0].worker == f"unix:{expected}"
            _all_reduce_pair(comms)
        finally:
            _close(comms)
    finally:
        worker.stop()


def test_default_socket_path_follows_the_daemon(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/run/user/1234")
    assert chorus.default_socket_path() == "/run/user/1234/chorus/worker.sock"
    fallback = f"/tmp/chorus-{os.getuid()}/worker.sock"
    monkeypatch.setenv("XDG_RUNTIME_DIR", "")  # empty counts as unset
    assert chorus.default_socket_path() == fallback
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    assert chorus.default_socket_path() == fallback


def test_missing_socket_is_unavailable_at_once(socket_dir: Path) -> None:
    path = socket_dir / "absent.sock"
    started = time.monotonic()
    with pytest.raises(chorus.Unavailable) as caught:
        chorus.join(unique_group(), 1, 0, worker=f"unix:{path}",
                    timeout=CALL_TIMEOUT)
    assert time.monotonic() - started < CALL_TIMEOUT / 2
    assert str(path) in caught.value.message
    assert "--local_socket" in caught.value.message
    # A file that is not a socket is a wrong argument.
    path.write_text("")
    with pytest.raises(chorus.InvalidArgument) as refused:
        chorus.join(unique_group(), 1, 0, worker=f"unix:{path}")
    assert "not a socket" in refused.value.message



@pytest.mark.skipif(os.geteuid() != 0,
                    reason="serving as another user needs root")
def test_socket_served_by_another_user_is_permission_denied(
        socket_dir: Path) -> None:
    """A socket whose server runs as another user (SO_PEERCRED) may be an
    impostor: refused before anything is sent to it.
    """
    os.chmod(socket_dir, 0o777)
    path = socket_dir / "impostor.sock"
    impostor = subprocess.Popen([
        "/usr/bin/python3", "-c",
        "import os, socket, sys, time\n"
        "os.setgid(65534); os.setuid(65534)\n"
        "s = socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); s.listen()\n"
        "print('ready', flush=True); time.sleep(60)\n", str(path)],
        stdout=subprocess.PIPE, text=True)
    try:
        assert impostor.stdout is not None
        assert impostor.stdout.readline().strip() == "ready"
        with pytest.raises(chorus.PermissionDenied) as caught:
            chorus.join(unique_group(), 1, 0, worker=f"unix:{path}",
                        timeout=CALL_TIMEOUT)
        assert "served by uid 65534" in caught.value.message
    finally:
        impostor.kill()
        impostor.wait()

# --- TLS directories refused before anything is sent -------------------------


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CA and certificates for workers w0 and w1, client app and admin
    admin (scripts/dev_certs.sh).
    """
    return make_certs(tmp_path_factory.mktemp("certs"))


def _refused(tls_dir: Any, *words: str) -> None:
    with pytest.raises(chorus.InvalidArgument) as caught:
        chorus.join(unique_group(), 1, 0, worker=NOWHERE, tls_dir=tls_dir,
                    timeout=CALL_TIMEOUT)
    for word in words:
        assert word in caught.value.message, caught.value.message


def test_bad_tls_dir_is_invalid_argument(certs: Path, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch
                                         ) -> None:
    monkeypatch.delenv("CHORUS_TLS_DIR", raising=False)
    _refused(tmp_path / "nowhere", "nowhere", "not a directory")
    partial = tmp_path / "partial"
    partial.mkdir()
    shutil.copy(certs / "client-app" / "ca.pem", partial)
    _refused(partial, str(partial / "cert.pem"), "ca.pem, cert.pem, key.pem")
    shutil.copy(certs / "client-app" / "cert.pem", partial)
    (partial / "key.pem").mkdir()  # there, but cannot be read as a file
    _refused(str(partial), str(partial / "key.pem"), "cannot read")
    (partial / "key.pem").rmdir()
    (partial / "key.pem").write_text("not a key\n")
    _refused(partial, str(partial / "key.pem"), "not a PEM file")
    _refused(42, "tls_dir must be a directory path")
    # From the environment, the message names the variable.
    monkeypatch.setenv("CHORUS_TLS_DIR", str(tmp_path / "gone"))
    _refused(None, "CHORUS_TLS_DIR", "gone")


# --- a cluster with mutual TLS -----------------------------------------------


@pytest.fixture(scope="module")
def tls(certs: Path, tmp_path_factory: pytest.TempPathFactory
        ) -> Iterator[Dict[str, Any]]:
    """A coordinator and workers w0 and w1, all with mutual TLS on
    127.0.0.1; w0 also serves a Unix socket.
    """
    sockets = short_temp_dir()
    cluster = Cluster(tmp_path_factory.mktemp("tls-cluster"), workers=(),
                      tls_dir=certs)
    try:
        cluster.add_worker("w0", local_socket=str(sockets / "w0.sock"))
        cluster.add_worker("w1")
        yield {"cluster": cluster, "certs": certs,
               "w0": cluster.address("w0"), "w1": cluster.address("w1"),
               "socket": cluster.workers["w0"].local_socket}
    finally:
        cluster.stop()
        shutil.rmtree(sockets, ignore_errors=True)


@pytest.fixture
def no_tls_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No CHORUS_TLS_DIR or CHORUS_WORKER from the test's environment."""
    monkeypatch.delenv("CHORUS_TLS_DIR", raising=False)
    monkeypatch.delenv("CHORUS_WORKER", raising=False)


@pytest.mark.parametrize("identity", ["client-app", "admin-admin"])
def test_tls_client_runs_collectives(tls: Dict[str, Any], identity: str,
                                     no_tls_env: None) -> None:
    comms = join_all([tls["w0"], tls["w1"]],
                     tls_dir=tls["certs"] / identity)
    try:
        _all_reduce_pair(comms)
    finally:
        _close(comms)


def test_tls_dir_from_the_environment(tls: Dict[str, Any],
                                      monkeypatch: pytest.MonkeyPatch
                                      ) -> None:
    monkeypatch.setenv("CHORUS_TLS_DIR", str(tls["certs"] / "client-app"))
    with chorus.join(unique_group(), 1, 0, worker=tls["w1"],
                     timeout=CALL_TIMEOUT) as comm:
        np.testing.assert_array_equal(
            comm.all_reduce(np.array([1, 2], np.int32)), [1, 2])


def test_worker_certificate_is_permission_denied(tls: Dict[str, Any],
                                                 no_tls_env: None) -> None:
    with pytest.raises(chorus.PermissionDenied) as caught:
        chorus.join(unique_group(), 1, 0, worker=tls["w0"],
                    tls_dir=tls["certs"] / "worker-w1", timeout=CALL_TIMEOUT)
    error = caught.value
    assert error.code == grpc.StatusCode.PERMISSION_DENIED
    # The daemon's own words: what it needs and whom it saw.
    assert "needs a client or admin certificate" in error.message, error
    assert "chorus://worker/w1" in error.message, error


def test_a_server_that_is_no_worker_is_unavailable(tls: Dict[str, Any],
                                                    no_tls_env: None) -> None:
    # The coordinator's port takes the client's certificate and shows one
    # from the same CA, for the host dialed; it names no worker.
    coordinator = tls["cluster"].coordinator.address
    with pytest.raises(chorus.Unavailable) as caught:
        chorus.join(unique_group(), 1, 0, worker=coordinator,
                    tls_dir=tls["certs"] / "client-app", timeout=10.0)
    assert "is no Chorus worker" in caught.value.message, caught.value
    assert "chorus://coordinator" in caught.value.message, caught.value


def test_plaintext_to_a_tls_worker_is_unavailable(tls: Dict[str, Any],
                                                  no_tls_env: None) -> None:
    timeout = 10.0
    started = time.monotonic()
    with pytest.raises(chorus.Unavailable) as caught:
        chorus.join(unique_group(), 1, 0, worker=tls["w0"], timeout=timeout)
    # The join waits for the connection at most `timeout`, then asks once.
    assert time.monotonic() - started < timeout + 20
    assert tls["w0"] in caught.value.message
    assert "tls_dir" in caught.value.message  # says what may be missing


def test_certificate_of_another_ca_is_unavailable(
        tls: Dict[str, Any], tmp_path: Path, no_tls_env: None) -> None:
    other = make_certs(tmp_path / "other-ca", workers=())
    with pytest.raises(chorus.Unavailable) as caught:
        chorus.join(unique_group(), 1, 0, worker=tls["w0"],
                    tls_dir=other / "client-app", timeout=10.0)
    assert "client-app" in caught.value.message  # names the TLS directory


def test_tls_to_a_plaintext_worker_is_unavailable(
        cluster: Cluster, certs: Path, no_tls_env: None) -> None:
    with pytest.raises(chorus.Unavailable) as caught:
        chorus.join(unique_group(), 1, 0, worker=cluster.address("w0"),
                    tls_dir=certs / "client-app", timeout=10.0)
    assert cluster.address("w0") in caught.value.message


def test_unix_socket_of_a_tls_worker_is_plaintext(
        tls: Dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    # A unix: target never reads the TLS directory (this one is absent),
    # while the TCP rank of the same group uses TLS.
    monkeypatch.setenv("CHORUS_TLS_DIR", "/nonexistent/chorus-tls")
    group = unique_group()
    comms = run_ranks([
        lambda: chorus.join(group, 2, 0, worker=f"unix:{tls['socket']}",
                            timeout=CALL_TIMEOUT),
        lambda: chorus.join(group, 2, 1, worker=tls["w1"],
                            tls_dir=tls["certs"] / "client-app",
                            timeout=CALL_TIMEOUT)])
    try:
        _all_reduce_pair(comms)
    finally:
        _close(comms)


# --- the torch backend passes tls_dir through --------------------------------


def rank_subgroup_with_tls(ctx: Any, tls_dir: str) -> str:
    """Makes a subgroup whose Options name `tls_dir`, all-reduces on it and
    returns "ok", or the chorus.Error's class name.
    """
    import torch
    import torch.distributed as dist
    from chorus.torch import Options
    try:
        group = dist.new_group([0], pg_options=Options(tls_dir=tls_dir))
    except chorus.Error as e:
        return type(e).__name__
    t = torch.ones(3)
    dist.all_reduce(t, group=group)
    return "ok" if t.tolist() == [1.0, 1.0, 1.0] else repr(t)


def test_torch_backend_uses_tls_dir(tls: Dict[str, Any],
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("torch.distributed")
    from torch_support import RankProcesses
    # The default group joins with the environment's directory; a subgroup
    # with its Options' one, which wins.
    monkeypatch.setenv("CHORUS_TLS_DIR", str(tls["certs"] / "client-app"))
    with RankProcesses([tls["w0"]], unique_group("torch-tls")) as ranks:
        assert ranks.values(rank_subgroup_with_tls, tls_dir=str(
            tls["certs"] / "admin-admin")) == ["ok"]
        assert ranks.values(rank_subgroup_with_tls, tls_dir=str(
            tls["certs"] / "worker-w0")) == ["PermissionDenied"]
