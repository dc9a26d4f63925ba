"""The namespace-cluster fixture against the table of design-27 section 1.1, with real namespaces.

Two nodes reach each other over TCP and each has its own loopback; the host reaches a node through
the bridge (as the login node ``.1``) and, without a bridge address, not at all (the blackhole answers
EINVAL, nothing leaves); a node reaches nothing outside its /24; hostnames, the private path,
``/tmp/ray`` and ``/dev/shm`` are per node while ``shared`` is shared; ``block()`` gives EACCES and
``unblock()`` restores; killing a node kills what runs in it and ``restart_node`` brings it back;
``stop()`` waits for stray processes, keeps the blackhole while one holds a namespace, and then
leaves nothing of its tag on the machine. The only addresses used are loopback, the test subnets and
one documentation address (203.0.113.1) that the node has no route to.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.fixtures.netns import NamespaceCluster, Node
from tests.fixtures.netns_host import children, is_gone, remnants, run_host
from tests.fixtures.netns_plan import NamespaceClusterError, tool
from tests.integration.cluster import netcheck

pytestmark = [pytest.mark.cluster, pytest.mark.integration, pytest.mark.timeout(60)]

NETCHECK = str(Path(netcheck.__file__).resolve())

Serve = Callable[[Node, int, int, Path], subprocess.Popen[bytes]]


def probe(node: Node, *args: object) -> str:
    """Run ``netcheck.py ARGS`` in ``node`` and return its one line of output."""
    return node.run([sys.executable, "-I", NETCHECK, *map(str, args)], timeout=30).stdout.strip()


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.01)


@pytest.fixture
def serve() -> Iterator[Serve]:
    """``serve(node, port, count, log)``: a netcheck server in ``node``; killed (its session) at the end."""
    started: list[subprocess.Popen[bytes]] = []

    def start(node: Node, port: int, count: int, log: Path) -> subprocess.Popen[bytes]:
        proc = node.popen([sys.executable, "-I", NETCHECK, "serve", str(port), str(count)], log=log)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=5)


def test_nodes_reach_each_other_over_tcp_and_keep_their_own_loopback(
    netns_cluster: NamespaceCluster, serve: Serve, tmp_path: Path
) -> None:
    a, b = netns_cluster.nodes
    server = serve(b, 7001, 2, tmp_path / "serve.log")
    assert probe(a, "connect", b.address, 7001, 10) == f"ok {b.name} {a.address}"
    assert probe(a, "connect", "127.0.0.1", 7001, 0) == f"errno {errno.ECONNREFUSED}"
    assert probe(b, "connect", "127.0.0.1", 7001, 0) == f"ok {b.name} 127.0.0.1"
    assert server.wait(timeout=10) == 0


def test_the_host_reaches_a_node_through_the_bridge(
    netns_cluster: NamespaceCluster, serve: Serve, tmp_path: Path
) -> None:
    node = netns_cluster.nodes[0]
    route = run_host(["ip", "route", "get", node.address])
    assert f"dev {netns_cluster.bridge}" in route and f"src {netns_cluster.host_address}" in route, route
    serve(node, 7002, 1, tmp_path / "serve.log")
    assert netcheck.connect(node.address, 7002, 10.0) == f"ok {node.name} {netns_cluster.host_address}"


def test_a_node_reaches_nothing_outside_its_subnet(netns_cluster: NamespaceCluster) -> None:
    # 203.0.113.1 (TEST-NET-3): the node has no route to it, so connect fails before any packet is sent
    assert probe(netns_cluster.nodes[0], "connect", "203.0.113.1", 9, 0) == f"errno {errno.ENETUNREACH}"


def test_hostnames_differ_and_node_names_resolve(netns_cluster: NamespaceCluster) -> None:
    a, b = netns_cluster.nodes
    assert [node.run(["hostname"]).stdout.strip() for node in netns_cluster.nodes] == [a.name, b.name]
    assert a.name != b.name
    assert probe(a, "resolve", b.name) == b.address
    assert a.run(["cat", "/etc/hosts"]).stdout == netns_cluster.hosts_file.read_text()


def test_private_ray_and_shm_are_per_node_while_shared_is_shared(netns_cluster: NamespaceCluster) -> None:
    shared, private = netns_cluster.shared, netns_cluster.private
    (shared / "from-host").write_text("hello\n")
    for node in netns_cluster.nodes:
        script = f"for d in {private} /tmp/ray /dev/shm; do echo {node.name} > $d/who; done; touch {shared}/{node.name}"
        node.run(["sh", "-c", script])
    for node in netns_cluster.nodes:
        seen = node.run(["cat", f"{private}/who", "/tmp/ray/who", "/dev/shm/who", f"{shared}/from-host"]).stdout
        assert seen.split() == [node.name] * 3 + ["hello"]
        assert (node.root / "private" / "who").read_text() == f"{node.name}\n"
        assert (node.root / "ray" / "who").read_text() == f"{node.name}\n"
    assert list(private.iterdir()) == []  # the host's own view of the private path
    assert not Path("/dev/shm/who").exists()
    assert {p.name for p in shared.iterdir()} >= {"from-host", *(node.name for node in netns_cluster.nodes)}


def test_the_environment_travels_through_popen_env_not_argv(netns_cluster: NamespaceCluster, tmp_path: Path) -> None:
    node = netns_cluster.nodes[0]
    env = {"PATH": os.environ["PATH"], "AREAL_TEST_SECRET": "s3cr3t"}
    argv = ["sh", "-c", 'echo "$AREAL_TEST_SECRET"']
    assert "s3cr3t" not in " ".join(node.command(argv))
    assert node.run(argv, env=env).stdout == "s3cr3t\n"
    log = tmp_path / "popen.log"
    proc = node.popen(argv, env=env, log=log)
    assert os.getsid(proc.pid) == proc.pid  # a session of its own
    assert proc.wait(timeout=10) == 0
    assert log.read_text() == "s3cr3t\n"


def test_block_gives_eacces_and_unblock_restores(netns_cluster: NamespaceCluster, serve: Serve, tmp_path: Path) -> None:
    a, b = netns_cluster.nodes
    serve(b, 7003, 1, tmp_path / "serve.log")
    a.block(b.address)
    try:
        assert probe(a, "connect", b.address, 7003, 0) == f"errno {errno.EACCES}"
    finally:
        a.unblock(b.address)
    assert probe(a, "connect", b.address, 7003, 10) == f"ok {b.name} {a.address}"


def test_killing_a_node_kills_its_processes_and_restart_brings_it_back(
    netns_cluster: NamespaceCluster, serve: Serve, tmp_path: Path
) -> None:
    a, b = netns_cluster.nodes
    sleeper = b.popen(["sleep", "600"], log=tmp_path / "sleep.log")
    wait_for(lambda: bool(children(sleeper.pid)), "the sleep in the node")
    (inner,) = children(sleeper.pid)
    b.kill()
    assert sleeper.wait(timeout=5) != 0
    assert is_gone(inner) and is_gone(b.init_pid)
    assert run_host(["ip", "netns", "pids", b.netns]).split() == []
    new = netns_cluster.restart_node(1)
    assert netns_cluster.nodes[1] is new
    assert (new.netns, new.address, new.name) == (b.netns, b.address, b.name) and new.init_pid != b.init_pid
    assert new.run(["hostname"]).stdout.strip() == new.name
    serve(new, 7004, 1, tmp_path / "serve.log")
    assert probe(a, "connect", new.address, 7004, 10) == f"ok {new.name} {a.address}"


def test_stop_waits_for_stray_processes_then_leaves_nothing(netns_cluster: NamespaceCluster, tmp_path: Path) -> None:
    other = NamespaceCluster(n_nodes=1, host_address=False, base=tmp_path / "other")
    other.start()
    stray: subprocess.Popen[bytes] | None = None
    try:
        assert other.tag != netns_cluster.tag and other.host_address is None
        node = other.nodes[0]
        # no bridge address: the blackhole answers at once, nothing leaves the machine
        assert netcheck.connect(node.address, 7005, 0.0) == f"errno {errno.EINVAL}"
        # a process in the netns but outside the node's PID namespace: killing the init does not kill it
        stray = subprocess.Popen([tool("nsenter"), f"--net=/run/netns/{node.netns}", "sleep", "600"])
        wait_for(lambda: str(stray.pid) in run_host(["ip", "netns", "pids", node.netns]).split(), "the stray process")
        with pytest.raises(NamespaceClusterError, match=rf"{node.netns}: {stray.pid} \(sleep 600\)"):
            other.stop(timeout=0.3)
        assert f"route blackhole {other.nodes[0].address.rsplit('.', 1)[0]}.0/24" in " ".join(remnants(other.tag))
        stray.kill()
        stray.wait(timeout=5)
        other.stop()
        assert remnants(other.tag) == []
    finally:
        if stray is not None and stray.poll() is None:
            stray.kill()
            stray.wait(timeout=5)
        other.stop()
