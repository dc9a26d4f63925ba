"""``areal launch KIND --config FILE [overrides]``: start a job on a cluster from outside it.

* ``areal launch ray|slurm|local --config F [overrides] [--detach]``: the job with
  ``cluster.scheduler=KIND``, submitted as the detached job ``<experiment>-<trial>`` through that
  scheduler's job backend after its preflight, then followed (log relayed, Ctrl-C cancels, the exit
  code is the job's) unless ``--detach``. The same code as ``areal train`` run outside the cluster
  (:mod:`areal_tasks.launch.submit`); ``local`` runs it as a detached process group on this machine.
* ``areal launch skypilot --config F [overrides] [-o task.yaml]``: writes the SkyPilot task that
  provisions the nodes and runs the job on them with the ray scheduler
  (:mod:`areal_tasks.launch.skypilot`); start it with ``sky launch``. The config is validated as
  for ``cluster.scheduler=ray``.

Heavy imports happen inside the handlers, so ``areal --help`` stays torch-free.
"""

from __future__ import annotations

import argparse
import sys

#: the kinds ``areal launch`` submits to (each must be a built scheduler when used).
SUBMIT_KINDS: tuple[str, ...] = ("ray", "slurm", "local")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "launch",
        help="submit a job to a cluster (ray, slurm, local) or write its SkyPilot task",
        description="Start a job from outside the cluster: submit and follow it, or write a SkyPilot task.",
    )
    kinds = parser.add_subparsers(dest="kind", metavar="KIND", parser_class=type(parser))
    kinds.required = True
    for kind in SUBMIT_KINDS:
        sub = kinds.add_parser(
            kind,
            help=f"submit the job with cluster.scheduler={kind} and follow it",
            description=f"Preflight, submit the job with cluster.scheduler={kind} as <experiment>-<trial>, follow it.",
        )
        _common(sub)
        sub.add_argument("--detach", action="store_true", help="print the job's name once submitted and return")
        sub.set_defaults(handler=run_submit, scheduler=kind)
    sky = kinds.add_parser(
        "skypilot",
        help="write the SkyPilot task YAML that runs the job on SkyPilot nodes (with Ray)",
        description="Write a SkyPilot task: resources, file mounts, setup and a run section with the job's Ray.",
    )
    _common(sky)
    sky.add_argument("-o", "--output", metavar="FILE", help="write the task here (default: standard output)")
    sky.set_defaults(handler=run_skypilot)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, metavar="FILE", help="job YAML, e.g. configs/demo_grpo.yaml")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="dotted overrides, e.g. cluster.nodes=2")


def run_submit(args: argparse.Namespace) -> int:
    from areal_tasks.config import load_config
    from areal_tasks.launch.submit import submit_and_follow

    cfg = load_config(args.config, [*args.overrides, f"cluster.scheduler={args.scheduler}"])
    return submit_and_follow(cfg, detach=args.detach)


def run_skypilot(args: argparse.Namespace) -> int:
    from pathlib import Path

    from areal_tasks.config import load_config
    from areal_tasks.launch.skypilot import render_task_yaml, skypilot_task
    from storage.atomic import write_local_text

    cfg = load_config(args.config, [*args.overrides, "cluster.scheduler=ray"])
    text = render_task_yaml(skypilot_task(cfg, args.config, list(args.overrides)))
    if not args.output:
        sys.stdout.write(text)
        return 0
    target = Path(args.output)
    target.parent.mkdir(parents=True, exist_ok=True)
    write_local_text(target, text)
    sys.stderr.write(
        f"wrote {target}; start it with: sky launch {target} --secret AREAL_CONFIG_SECRETS"
        + (" --secret AWS_ACCESS_KEY_ID --secret AWS_SECRET_ACCESS_KEY" if "AWS_ACCESS_KEY_ID" in text else "")
        + " (each --secret NAME takes its value from your environment)\n"
    )
    return 0
