"""Entry point of one SFT train rank: ``python -m areal_tasks.trainer.sft_worker --config FILE [overrides]``.

Started by :func:`areal_tasks.trainer.sft.run_sft` through the Scheduler with the torch.distributed
environment (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``/``MASTER_PORT``). ``model.path`` must name
a local model directory here (the controller resolves ``tiny:<family>`` before it starts workers).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

logger = logging.getLogger(__name__)


def _setup_logging() -> None:
    rank = os.environ.get("RANK", "0")
    logging.basicConfig(
        level=logging.INFO,
        format=f"%(asctime)s [sft rank {rank}] %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    from storage.redact import install_log_redaction

    install_log_redaction()  # the config's secrets, once loaded, are masked in this log


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, train this rank, and return the exit code."""
    parser = argparse.ArgumentParser(prog="areal_tasks.trainer.sft_worker", description=__doc__)
    parser.add_argument("--config", required=True, help="job YAML (the controller writes a resolved one)")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. train.sft_warmup_steps=10")
    args = parser.parse_args(argv)
    _setup_logging()
    from areal_tasks.config import load_config
    from areal_tasks.trainer.sft_loop import run_sft_rank

    cfg = load_config(args.config, args.overrides)
    run_sft_rank(cfg, cfg.model.path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
