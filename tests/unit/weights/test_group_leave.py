"""Leaving a weight-update group never hangs: ``leave_process_group`` bounds ``destroy_process_group``
and aborts the group locally when a member never leaves (NCCL's destroy waits for its peers).

A real one-member gloo group is destroyed cleanly; a destroy that blocks (a stand-in for NCCL
waiting on a server that is gone) is given up after the bound, the group aborted, and a warning
names it. A server's leave (``CollectiveReceiver.leave``) goes through the same bounded path.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import timedelta

import pytest
import torch

from areal_tasks.weights import group
from areal_tasks.weights.group import WeightGroup, init_custom_process_group, leave_process_group


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _one_member_group(name: str):
    return init_custom_process_group("gloo", "127.0.0.1", _free_port(), 1, 0, name, timedelta(seconds=10))


def test_a_clean_destroy_returns_true_and_unregisters_the_group() -> None:
    from torch.distributed import distributed_c10d

    pg = _one_member_group("leave_clean")
    member = WeightGroup("leave_clean", 0, 1, "gloo", torch.device("cpu"), pg)
    assert member.destroy(timeout_s=10.0) is True
    assert pg not in distributed_c10d._world.pg_map


def test_a_real_abort_unregisters_the_group() -> None:
    from torch.distributed import distributed_c10d

    pg = _one_member_group("leave_abort")
    group.abort_process_group(pg)
    assert pg not in distributed_c10d._world.pg_map
    with pytest.raises(ValueError):
        group.abort_process_group(pg)  # gone already


def test_a_destroy_that_never_returns_is_aborted_after_the_bound(monkeypatch, caplog) -> None:
    release = threading.Event()
    aborted: list[object] = []
    monkeypatch.setattr(torch.distributed, "destroy_process_group", lambda pg: release.wait(30))
    monkeypatch.setattr(group, "abort_process_group", aborted.append)
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger=group.__name__):
        assert leave_process_group("PG", "stuck_group", timeout_s=0.2) is False
    release.set()
    assert time.monotonic() - started < 5.0
    assert aborted == ["PG"]
    assert "stuck_group" in caplog.text and "aborting" in caplog.text


def test_a_failed_destroy_is_aborted_and_never_raises(monkeypatch, caplog) -> None:
    def fail(pg: object) -> None:
        raise RuntimeError("peer reset")

    def abort_fails(pg: object) -> None:
        raise RuntimeError("abort failed too")

    monkeypatch.setattr(torch.distributed, "destroy_process_group", fail)
    monkeypatch.setattr(group, "abort_process_group", abort_fails)
    with caplog.at_level(logging.WARNING, logger=group.__name__):
        assert leave_process_group("PG", "broken_group", timeout_s=5.0) is False
    assert "peer reset" in caplog.text and "abort failed too" in caplog.text


def test_the_server_side_destroy_is_bounded_too(monkeypatch) -> None:
    from areal_tasks.weights.collective import CollectiveReceiver

    release = threading.Event()
    aborted: list[object] = []
    monkeypatch.setattr(torch.distributed, "destroy_process_group", lambda pg: release.wait(30))
    monkeypatch.setattr(group, "abort_process_group", aborted.append)
    receiver = CollectiveReceiver(torch.device("cpu"))
    receiver.groups["server_group"] = WeightGroup("server_group", 1, 2, "gloo", torch.device("cpu"), "PG")
    assert receiver.leave("server_group", timeout_s=0.2) is False
    assert receiver.leave("server_group") is None  # gone either way
    release.set()
    assert aborted == ["PG"]
