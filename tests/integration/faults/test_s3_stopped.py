"""The S3 server stops in the middle of a checkpoint save (issue #26, item 7).

An S3 server of this test's own (SeaweedFS on loopback, not the session's) holds a run's
checkpoints. Step 1 is saved. During step 2, right before the first byte of its data is uploaded,
the server is stopped for real. The save must fail cleanly and promptly (a refused connection is a
permanent storage error, not something to retry for minutes), step 1 must stay complete, verifiable
against its recorded sha256 sums and loadable, and after the server comes back on the same port
the next save of step 2 must succeed and load back equal to the engine.
"""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from areal_tasks.checkpoint.manager import CheckpointManager
from areal_tasks.checkpoint.state import TrainerState
from areal_tasks.config.sections import SaverConfig
from areal_tasks.errors import CheckpointError
from storage.errors import StorageError
from storage.testing.seaweed import SeaweedS3Server, find_weed_binary
from tests.fixtures.faults import verify_checkpoint_files
from tests.unit.checkpoint.toy_engine import ToyEngine

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

#: the failed save must end well within this (it is no timed assert: a hang fails the test).
FAIL_WITHIN_S = 60.0


@pytest.fixture
def own_s3(tmp_path: Path) -> Iterator[SeaweedS3Server]:
    if importlib.util.find_spec("s3fs") is None:
        pytest.skip("s3fs is not installed (the 'storage' extra)")
    try:
        binary = find_weed_binary()
    except StorageError as exc:
        pytest.skip(str(exc))
    server = SeaweedS3Server(tmp_path / "seaweed", binary=binary)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _stop_server_before_first_upload(
    manager: CheckpointManager, server: SeaweedS3Server, prefix: str
) -> list[tuple[str, float]]:
    """Make the first write or upload under ``prefix`` stop ``server`` first; returns ``(key, when
    the server was down)``."""
    storage = manager.layout.storage
    original: Callable[..., Any] = storage.run
    seen: list[tuple[str, float]] = []

    def run(what: str, key: str, fn: Callable[[], Any], *, retry: bool = True) -> Any:
        if what in ("write", "upload") and key.startswith(prefix) and not seen:
            server.stop()
            seen.append((key, time.monotonic()))
        return original(what, key, fn, retry=retry)

    storage.run = run  # type: ignore[method-assign]
    return seen


def test_s3_stopped_during_save(own_s3: SeaweedS3Server) -> None:
    bucket = own_s3.create_bucket("faults")
    options = {**own_s3.storage_options(), "connect_timeout": 2, "read_timeout": 5}
    url = f"s3://{bucket}/runs"
    manager = CheckpointManager(url, options, "exp", "t0", SaverConfig(keep_last=3))
    engine = ToyEngine(seed=0)
    engine.train_step()
    manager.save(1, {"actor": engine}, TrainerState(step=1), {"loss": 1.0}).wait()
    saved_1 = engine.params()
    engine.train_step()

    seen = _stop_server_before_first_upload(manager, own_s3, "step_2/")
    with pytest.raises((StorageError, CheckpointError)) as failure:
        manager.save(2, {"actor": engine}, TrainerState(step=2), {"loss": 0.5}).wait()
    assert seen and seen[0][0].startswith("step_2/"), seen
    detected_s = time.monotonic() - seen[0][1]
    assert detected_s < FAIL_WITHIN_S, f"the failed save took {detected_s:.1f} s"
    message = str(failure.value)
    assert own_s3.endpoint_url.split("//")[1] in message or "step_2" in message, message
    print(
        f"[fault-timing] s3 stopped mid-save: save failed {detected_s:.2f} s after the server was down: {message[:160]}"
    )

    restarted = time.monotonic()
    own_s3.restart()
    restart_s = time.monotonic() - restarted
    reader = CheckpointManager(url, options, "exp", "t0", SaverConfig(keep_last=3))
    assert reader.latest() == 1
    assert verify_checkpoint_files(reader, 1) > 0
    listing = {info.step: info.status for info in reader.list()}
    assert listing.get(1) == "complete" and listing.get(2) in (None, "partial"), listing
    fresh = ToyEngine(seed=7)
    assert reader.load(1, {"actor": fresh}).step == 1
    assert all(torch.equal(value, saved_1[name]) for name, value in fresh.params().items())

    saved_again = time.monotonic()
    reader.save(2, {"actor": engine}, TrainerState(step=2), {"loss": 0.5}).wait()
    save_s = time.monotonic() - saved_again
    assert reader.latest() == 2
    assert verify_checkpoint_files(reader, 2) > 0
    loaded = ToyEngine(seed=9)
    assert reader.load(2, {"actor": loaded}).step == 2
    assert all(torch.equal(value, engine.params()[name]) for name, value in loaded.params().items())
    print(f"[fault-timing] s3 stopped mid-save: restart on the same port {restart_s:.2f} s, next save {save_s:.2f} s")
