"""Entry point of one RL train rank: ``python -m areal_tasks.trainer.rl_worker --config FILE [overrides]``.

Started by :func:`areal_tasks.trainer.rl.run_train` through the Scheduler with the torch.distributed
environment (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``/``MASTER_PORT``) and the inference servers'
addresses in ``AREAL_INFERENCE_ADDRESSES`` (comma-separated ``host:port``). ``model.path`` names the
local directory of the starting policy (the controller resolves it and runs any SFT warm start).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from areal_tasks.api.run_dir import INFERENCE_ADDRESSES_ENV
from areal_tasks.errors import ConfigError

logger = logging.getLogger(__name__)

#: environment variable carrying the servers' addresses.


def server_addresses() -> list[str]:
    """The addresses the controller passed in :data:`INFERENCE_ADDRESSES_ENV`."""
    raw = os.environ.get(INFERENCE_ADDRESSES_ENV, "")
    addresses = [a.strip() for a in raw.split(",") if a.strip()]
    if not addresses:
        raise ConfigError(
            f"{INFERENCE_ADDRESSES_ENV} is empty: the RL worker needs the inference servers' host:port list"
        )
    return addresses


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, run this rank's RL loop, return the exit code."""
    parser = argparse.ArgumentParser(prog="areal_tasks.trainer.rl_worker", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="job YAML (the controller writes a resolved one)")
    parser.add_argument("overrides", nargs="*", help="dotted overrides")
    args = parser.parse_args(argv)
    rank = os.environ.get("RANK", "0")
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format=f"%(asctime)s [rl rank {rank}] %(levelname)s %(name)s: %(message)s",
    )
    from areal_tasks.quiet_logs import quiet_third_party_loggers

    quiet_third_party_loggers()
    from storage.redact import install_log_redaction

    install_log_redaction()  # the config's secrets, once loaded, are masked in this log
    from areal_tasks.config import load_config
    from areal_tasks.trace import configure_from_env
    from areal_tasks.trainer.rl_loop import run_rl_rank

    configure_from_env(f"train rank {rank}")
    cfg = load_config(args.config, args.overrides)
    run_rl_rank(cfg, cfg.model.path, server_addresses())
    return 0


if __name__ == "__main__":
    sys.exit(main())
