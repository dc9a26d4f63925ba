"""The pure parts of the namespace-cluster fixture (tests/fixtures/netns_plan.py), without root: the
nsenter command line, the choice of the subnet tag K, the hosts file and a node init's script; and
that the fixture module imports and reports why it cannot run for a user who is not root.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.fixtures.netns import NamespaceCluster, Node
from tests.fixtures.netns_plan import (
    NamespaceClusterError,
    choose_tag,
    hosts_text,
    init_script,
    node_address,
    node_name,
    nsenter_command,
    tags_in_use,
)


def test_nsenter_command_enters_pid_net_mount_and_uts_namespaces_at_cwd() -> None:
    cmd = nsenter_command(4242, ["python", "-c", "print(1)"], "/work/x")
    assert Path(cmd[0]).name == "nsenter"
    assert cmd[1:] == ["-t", "4242", "-p", "-n", "-m", "-u", "--wd=/work/x", "--", "python", "-c", "print(1)"]
    with pytest.raises(NamespaceClusterError, match="empty argv"):
        nsenter_command(1, [], "/")


def test_node_command_defaults_to_the_current_directory() -> None:
    node = Node(0, "ar3n0", "10.231.3.10", "ar3n0", 77, Path("/tmp/n"))
    assert node.command(["hostname"])[-3:] == [f"--wd={Path.cwd()}", "--", "hostname"]
    assert node.command(["hostname"], cwd=Path("/srv"))[-3] == "--wd=/srv"


def test_names_and_addresses() -> None:
    assert [node_name(7, i) for i in range(2)] == ["ar7n0", "ar7n1"]
    assert [node_address(7, i) for i in range(2)] == ["10.231.7.10", "10.231.7.11"]


def test_choose_tag_takes_the_lowest_free_k() -> None:
    assert choose_tag([], []) == 0
    routes = [
        "default via 192.0.2.1 dev eth0",
        "blackhole 10.231.0.0/24 metric 4000",
        "10.231.1.0/24 dev ar1br proto kernel scope link src 10.231.1.1",
        "local 10.231.2.1 dev ar2br table local proto kernel scope host src 10.231.2.1",
        "10.231.0.0/16 via 192.0.2.7 dev eth0",  # broader than a /24: takes no tag
        "fe80::/64 dev eth0 proto kernel metric 256 pref medium",
        "unreachable 10.232.3.0/24",  # another /16
    ]
    assert tags_in_use(routes, []) == {0, 1, 2}
    assert choose_tag(routes, []) == 3
    assert choose_tag(routes, ["ar3n0", "ar4br", "eth0", "arp0", "lo"]) == 5
    assert tags_in_use([], ["ar10n1-h", "ar27a"]) == {10, 27}  # ar10... takes 10, not 1


def test_choose_tag_fails_when_every_subnet_is_taken() -> None:
    with pytest.raises(NamespaceClusterError, match="every subnet"):
        choose_tag([f"blackhole 10.231.{k}.0/24 metric 4000" for k in range(256)], [])


def test_hosts_text_names_the_host_only_when_it_has_an_address() -> None:
    assert hosts_text(5, 2, host_address=True) == (
        "127.0.0.1 localhost\n10.231.5.1 ar5host\n10.231.5.10 ar5n0\n10.231.5.11 ar5n1\n"
    )
    assert hosts_text(5, 1, host_address=False) == "127.0.0.1 localhost\n10.231.5.10 ar5n0\n"


def test_init_script_mounts_then_signals_ready_then_execs_the_reaper() -> None:
    script = init_script(
        name="ar5n1",
        root=Path("/tmp/base dir/nodes/ar5n1"),
        private=Path("/tmp/base dir/private"),
        hosts_file=Path("/tmp/base dir/hosts"),
        shm_size="1g",
        python="/usr/bin/python3",
    )
    lines = script.splitlines()
    assert lines[:6] == [
        "set -e",
        "hostname ar5n1",
        "mount --bind '/tmp/base dir/nodes/ar5n1/private' '/tmp/base dir/private'",
        "mount --bind '/tmp/base dir/nodes/ar5n1/ray' /tmp/ray",
        "mount -t tmpfs -o size=1g tmpfs /dev/shm",
        "mount --bind '/tmp/base dir/hosts' /etc/hosts",
    ]
    assert lines[6] == "echo ready > '/tmp/base dir/nodes/ar5n1/ready'"
    assert script.split("\n", 7)[7].startswith("exec /usr/bin/python3 -I -S -c 'import os, time")


def test_unavailable_reason_names_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert "root" in (NamespaceCluster.unavailable_reason() or "")


def test_a_cluster_needs_at_least_one_node(tmp_path: Path) -> None:
    with pytest.raises(NamespaceClusterError, match="n_nodes"):
        NamespaceCluster(n_nodes=0, base=tmp_path)
    cluster = NamespaceCluster(n_nodes=3, base=tmp_path)
    assert (cluster.shared, cluster.private, cluster.hosts_file) == (
        tmp_path / "shared",
        tmp_path / "private",
        tmp_path / "hosts",
    )
    assert cluster.nodes == [] and cluster.host_address is None
