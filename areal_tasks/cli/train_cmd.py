"""``areal train --config FILE [overrides] [--detach]``: run an RL job (SFT warm start, servers, RL workers).

Overrides are dotted ``key=value`` pairs (``train.total_steps=20``); the config is validated before
anything starts. Where the controller runs depends on ``cluster.scheduler``:

* here, when the scheduler allows it (``local`` always; ``ray`` on a node of the Ray cluster;
  ``slurm`` inside a batch job): the run's figures go to ``<run_dir>/summary.json``, a table is
  printed at the end and the run report is written to ``<run_dir>/report.html``
  (:mod:`areal_tasks.report`; skipped, saying so, without plotly);
* otherwise (a login node, a laptop) the command runs the scheduler's preflight, submits itself as
  the detached job ``<experiment>-<trial>`` and follows it: the job's log is relayed, Ctrl-C cancels
  it, and the exit code is the job's (0 succeeded, 1 failed, 130 cancelled). ``--detach`` prints the
  job's name and returns once it is submitted (see :mod:`areal_tasks.launch.submit`).

Heavy imports happen inside the handler, so ``areal --help`` stays torch-free.
"""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "train",
        help="run an RL job: SFT warm start, inference servers, train workers",
        description=(
            "Train a policy with asynchronous RL as the config says; writes <run_dir>/summary.json. "
            "Outside the scheduler's cluster (ray, slurm), submits itself as a detached job and follows it."
        ),
    )
    parser.add_argument("--config", required=True, metavar="FILE", help="job YAML, e.g. configs/demo_grpo.yaml")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="dotted overrides, e.g. train.total_steps=20")
    parser.add_argument(
        "--detach",
        action="store_true",
        help="when the job is submitted to a cluster: print its name and return instead of following it",
    )
    parser.set_defaults(handler=run_train_cmd)


def run_train_cmd(args: argparse.Namespace) -> int:
    import logging

    from areal_tasks.config import load_config
    from areal_tasks.launch.registry import runs_here
    from areal_tasks.quiet_logs import quiet_third_party_loggers

    quiet_third_party_loggers()
    cfg = load_config(args.config, args.overrides)
    if not runs_here(cfg):
        from areal_tasks.launch.submit import check_not_resubmitting, submit_and_follow

        check_not_resubmitting(cfg)
        return submit_and_follow(cfg, detach=args.detach)
    if args.detach:
        logging.getLogger(__name__).warning(
            "--detach is for jobs submitted to a cluster; the %s scheduler runs the job here, in the foreground "
            "(for a detached local job use the Airflow DAG or `areal launch local`)",
            cfg.cluster.scheduler,
        )
    from areal_tasks.trainer.rl import format_summary, run_train

    summary = run_train(cfg)
    print(format_summary(summary))
    print(f"summary written to {cfg.experiment.run_dir}/summary.json")
    _write_run_report(cfg.experiment.run_dir)
    return 0


def _write_run_report(run_dir: str) -> None:
    """The run's HTML report next to its summary (the Airflow pipeline rewrites it with its own figures)."""
    import importlib.util

    if importlib.util.find_spec("plotly") is None:
        print(f"no run report: plotly is not installed (the tracking extra); later: areal report {run_dir}")
        return
    from areal_tasks.report import write_report

    path = write_report(run_dir)
    print(f"run report: {path.resolve().as_uri()}")
