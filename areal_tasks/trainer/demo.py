"""The ``make run`` pipeline: SFT warm start, then the base and the SFT model evaluated side by side.

``python -m areal_tasks.trainer.demo --config configs/demo_grpo.yaml [overrides] [--latest runs/latest]``

1. evaluates the base model (``model.path``; ``tiny:<family>`` is built by the kit) on the eval
   split through one embedded inference server;
2. runs ``train.sft_warmup_steps`` SFT steps on the actor's data-parallel ranks (``run_sft``);
3. evaluates the SFT model the same way;
4. prints a summary table and writes ``<run_dir>/summary.json`` (accuracy and mean reward before and
   after SFT, steps, first/last loss, wall seconds per phase, model directories, sample completions);
   ``--latest`` makes that path a symlink to the run dir.

All processes are started through one ``LocalScheduler`` and stopped at the end.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)


def _read_losses(path: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def run_demo(cfg: Any, n_prompts: int | None = None) -> dict[str, Any]:
    """Run the pipeline for a resolved ``JobConfig`` and return the summary (also written to the run dir)."""
    from areal_tasks.datasets.registry import load_split
    from areal_tasks.launch import LocalScheduler
    from areal_tasks.trainer.evaluate import evaluate
    from areal_tasks.trainer.sft import resolve_model_dir, run_sft
    from areal_tasks.trainer.sft_loop import SFTPaths

    run_dir = Path(cfg.experiment.run_dir)
    n_eval = n_prompts or cfg.evaluation.max_eval_prompts or len(load_split(cfg.dataset, "eval"))
    started = time.perf_counter()
    base_dir = resolve_model_dir(cfg)
    with LocalScheduler(run_dir) as scheduler:
        before = evaluate(cfg, base_dir, n_eval, scheduler=scheduler, name="eval-base")
        sft_started = time.perf_counter()
        sft_dir = run_sft(cfg, scheduler)
        sft_s = time.perf_counter() - sft_started
        after = evaluate(cfg, str(sft_dir), n_eval, scheduler=scheduler, name="eval-sft")
    losses = _read_losses(SFTPaths.of(run_dir).metrics)
    summary = {
        "run_dir": str(run_dir),
        "base_model_dir": base_dir,
        "sft_model_dir": str(sft_dir),
        "dataset": cfg.dataset.path,
        "eval_prompts": n_eval,
        "sft_steps": cfg.train.sft_warmup_steps,
        "sft_loss_first": losses[0],
        "sft_loss_last": losses[-1],
        "before": {k: before[k] for k in ("accuracy", "mean_reward", "answer_rate", "wall_s")},
        "after": {k: after[k] for k in ("accuracy", "mean_reward", "answer_rate", "wall_s")},
        "sft_wall_s": sft_s,
        "wall_s": time.perf_counter() - started,
        "samples_before": before["samples"],
        "samples_after": after["samples"],
    }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2), encoding="utf-8")
    return summary


def format_summary(summary: dict[str, Any]) -> str:
    """A small text table of the summary."""
    rows = [("", "base", "after SFT")]
    for key in ("accuracy", "mean_reward", "answer_rate", "wall_s"):
        rows.append((key, f"{summary['before'][key]:.3f}", f"{summary['after'][key]:.3f}"))
    lines = [f"{a:<12} {b:>10} {c:>10}" for a, b, c in rows]
    lines += [
        f"SFT: {summary['sft_steps']} steps, loss {summary['sft_loss_first']:.3f} -> {summary['sft_loss_last']:.3f}, "
        f"{summary['sft_wall_s']:.1f} s",
        f"eval prompts: {summary['eval_prompts']} ({summary['dataset']})",
        f"SFT model: {summary['sft_model_dir']}",
        f"total: {summary['wall_s']:.1f} s",
    ]
    lines += [f"  sample: {s['prompt']!r} -> {s['completion']!r} (reference {s['answer']})" for s in summary["samples_after"]]
    return "\n".join(lines)


def _link_latest(link: Path, run_dir: Path) -> None:
    if link.is_symlink() or link.is_file():
        link.unlink()
    elif link.exists():
        raise FileExistsError(f"{link} exists and is not a symlink; remove it or pass another --latest path")
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(os.path.relpath(run_dir, link.parent))


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, run the pipeline, print the table; return the exit code."""
    parser = argparse.ArgumentParser(prog="areal_tasks.trainer.demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="job YAML, e.g. configs/demo_grpo.yaml")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. train.sft_warmup_steps=50")
    parser.add_argument("--eval-prompts", type=int, default=None, help="eval prompts (default: the whole split)")
    parser.add_argument("--latest", type=Path, default=None, help="make this path a symlink to the run dir")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s [demo] %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    from areal_tasks.config import load_config

    cfg = load_config(args.config, args.overrides)
    summary = run_demo(cfg, args.eval_prompts)
    if args.latest is not None:
        _link_latest(args.latest, Path(cfg.experiment.run_dir))
    print(format_summary(summary))
    print(f"summary written to {Path(cfg.experiment.run_dir) / 'summary.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
