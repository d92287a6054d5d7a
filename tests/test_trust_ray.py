"""A local Ray cluster started by the toolkit listens on the loopback interface only: during a
tiny Ray sweep, every listening socket of the driver and of the processes it started (gcs_server,
raylet, agents, workers) is bound to 127.0.0.1 (before the fix: `::` / 0.0.0.0 and the machine's
network address)."""

import ipaddress
import os
import socket

import pytest

ray = pytest.importorskip("ray")
psutil = pytest.importorskip("psutil")   # ray ships one in its thirdparty_files

import sweep_trials  # noqa: E402
from interp.sweep.executors import make_executor  # noqa: E402
from interp.sweep.run import Sweep  # noqa: E402


def listeners() -> list[tuple[str, str]]:
    """(process name, bound address) of every TCP/UDP listener of this process and its descendants."""
    me = psutil.Process(os.getpid())
    processes = {p.pid: p for p in [me, *me.children(recursive=True)]}
    found = []
    for connection in psutil.net_connections("inet"):
        listening = connection.status == psutil.CONN_LISTEN or connection.type == socket.SOCK_DGRAM
        if connection.pid in processes and listening:
            try:
                name = processes[connection.pid].name()
            except psutil.Error:
                name = str(connection.pid)
            found.append((name, connection.laddr.ip))
    return found


def is_loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    ip = getattr(ip, "ipv4_mapped", None) or ip
    return ip.is_loopback


def test_local_ray_cluster_listens_on_loopback_only(tmp_path):
    if ray.is_initialized():
        pytest.skip("Ray is already initialised in this process")
    executor = make_executor("ray", workers=1, max_retries=0)
    try:
        sweep = Sweep(tmp_path, executor, sweep_trials.square, progress=False)
        rows = sweep([{"x": 2}, {"x": 3}])
        assert [r["value"] for r in rows] == [4, 9]
        found = listeners()
        names = {name for name, _ in found}
        assert {"gcs_server", "raylet"} <= names, found            # the cluster's servers were seen
        exposed = [(name, address) for name, address in found if not is_loopback(address)]
        assert not exposed, f"listening beyond localhost: {exposed}"
        assert ray.util.get_node_ip_address() == "127.0.0.1"
    finally:
        executor.close()


def test_a_cluster_that_comes_up_on_another_address_is_refused(monkeypatch):
    """Should Ray stop honouring the loopback node address (its flag gone), the executor shuts the
    cluster down and refuses, rather than run trials on a cluster reachable from the network."""
    import contextlib

    from interp.sweep import ray_executor

    if ray.is_initialized():
        pytest.skip("Ray is already initialised in this process")
    if is_loopback(ray._private.services.node_ip_address_from_perspective()):
        pytest.skip("this machine has no network address for Ray to pick")
    monkeypatch.setattr(ray_executor, "_loopback_node", contextlib.nullcontext)
    executor = make_executor("ray", workers=1, max_retries=0)
    try:
        with pytest.raises(RuntimeError, match="not 127.0.0.1: refusing to run trials"):
            executor._connect()
        assert not ray.is_initialized()
    finally:
        executor.close()
