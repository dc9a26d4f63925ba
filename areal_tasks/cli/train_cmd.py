"""``areal train --config FILE [overrides]``: run an RL job (SFT warm start, servers, RL workers).

Overrides are dotted ``key=value`` pairs (``train.total_steps=20``); the config is validated before
anything starts. The run's figures go to ``<run_dir>/summary.json`` and a table is printed at the end.
Heavy imports happen inside the handler, so ``areal --help`` stays torch-free.
"""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "train",
        help="run an RL job: SFT warm start, inference servers, train workers",
        description="Train a policy with asynchronous RL as the config says; writes <run_dir>/summary.json.",
    )
    parser.add_argument("--config", required=True, metavar="FILE", help="job YAML, e.g. configs/demo_grpo.yaml")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="dotted overrides, e.g. train.total_steps=20")
    parser.set_defaults(handler=run_train_cmd)


def run_train_cmd(args: argparse.Namespace) -> int:
    import logging

    from areal_tasks.config import load_config
    from areal_tasks.trainer.rl import format_summary, run_train

    logging.getLogger("httpx").setLevel(logging.WARNING)
    cfg = load_config(args.config, args.overrides)
    summary = run_train(cfg)
    print(format_summary(summary))
    print(f"summary written to {cfg.experiment.run_dir}/summary.json")
    return 0
