"""The progress relay shows only the newest tqdm line a worker logged, once, and ends the line."""

from __future__ import annotations

import io
from pathlib import Path

from areal_tasks.trainer.progress_relay import ProgressRelay


def test_relays_the_newest_bar_line_only(tmp_path: Path) -> None:
    log = tmp_path / "0.log"
    out = io.StringIO()
    relay = ProgressRelay(log, out)
    assert relay.poll() is None  # no log yet
    log.write_text(
        "2026 INFO starting\n"
        "sft:   0%|          | 0/300 [00:00<?, ?it/s]\r"
        "sft:   1%|          | 3/300 [00:01<01:40,  2.9it/s, loss=6.9]"
    )
    shown = relay.poll()
    assert shown is not None and shown.startswith("sft:   1%|") and "3/300" in shown
    assert relay.poll() is None  # nothing new
    with log.open("a") as handle:
        handle.write("\n2026 INFO weights written\n")  # not a bar: nothing to show
    assert relay.poll() is None
    with log.open("a") as handle:
        handle.write("\rrl: 100%|##########| 40/40 [01:57<00:00,  3.25s/it, reward=0.53]")
    assert "40/40" in relay.poll()
    relay.close()
    text = out.getvalue()
    assert text.count("\r") == 2 and text.endswith("\n") and "INFO" not in text
