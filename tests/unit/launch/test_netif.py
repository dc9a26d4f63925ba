"""The gloo/NCCL interface follows the node address, and never overrides the user's choice."""

from __future__ import annotations

from areal_tasks.launch.netif import interface_for, pin_socket_interface


def test_loopback_has_an_interface_and_one_machine_sets_nothing() -> None:
    assert interface_for("127.0.0.1") == "lo"
    env = {"AREAL_NODE_ADDR": "127.0.0.1"}
    assert pin_socket_interface(env) is None and "GLOO_SOCKET_IFNAME" not in env


def test_an_unknown_address_sets_nothing() -> None:
    env = {"AREAL_NODE_ADDR": "192.0.2.77"}  # TEST-NET-1: held by no interface here
    assert pin_socket_interface(env) is None and "GLOO_SOCKET_IFNAME" not in env


def test_the_users_choice_wins() -> None:
    env = {"AREAL_NODE_ADDR": "10.0.0.1", "NCCL_SOCKET_IFNAME": "ib0"}
    assert pin_socket_interface(env) is None and env["NCCL_SOCKET_IFNAME"] == "ib0"
