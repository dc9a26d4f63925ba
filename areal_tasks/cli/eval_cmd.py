"""``areal eval --model DIR [--data URL ...] [--reward NAME] [--n-samples K] [--out FILE]``: evaluate a model.

Serves ``--model`` with one inference server of the config's ``rollout.backend`` (embedded by
default), samples ``--n-samples`` completions of every item of each ``--data`` set (``NAME=URL``
names a set; none: the config's eval split), scores them with ``--reward`` (default: the config's
``rollout.reward.fn``) and prints one JSON object: ``pass@1``, ``pass@K``, ``maj@K``,
``answer_rate``, ``mean_response_length``, ``n_items``, ``n_samples`` and the run's facts (see
:mod:`areal_tasks.evaluation.report`). ``--out FILE`` also writes it there, and the per-item
records to ``FILE`` with ``.items.jsonl`` (or ``--items FILE``). Exit codes: 0 evaluated; 2 bad
input (a missing model directory, an unreadable set, an unknown reward, ``k`` above
``--n-samples``...), with a message saying what to fix; 1 the server or a reward failed at run
time. Heavy imports happen inside the handler, so ``areal --help`` stays torch-free. Reference:
docs/evaluation.md.
"""

from __future__ import annotations

import argparse
import json
import sys


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "eval",
        help="evaluate a model on eval sets: pass@1, pass@k, maj@k, answer rate (docs/evaluation.md)",
        description=(
            "Serve a model with one inference server (the config's rollout.backend), sample completions of "
            "every item of each eval set, score them with a reward and print pass@1, pass@K, maj@K, "
            "answer_rate and mean_response_length as JSON."
        ),
    )
    parser.add_argument(
        "--model",
        required=True,
        metavar="DIR",
        help="model to evaluate: a Hugging Face model directory, a hub id (org/name) or tiny:<family>",
    )
    parser.add_argument(
        "--data",
        action="append",
        default=[],
        metavar="[NAME=]URL",
        help="eval set: a .jsonl of {prompt, answer} objects, demo:<task>, or another dataset URL; repeatable. "
        "Default: the config's eval split",
    )
    parser.add_argument(
        "--reward", default=None, metavar="NAME", help="reward name or package.module:function (default: config's)"
    )
    parser.add_argument("--n-samples", type=int, default=1, metavar="K", help="completions per item (default 1)")
    parser.add_argument("--k", type=int, default=None, help="k of pass@k and maj@k (default: --n-samples)")
    parser.add_argument(
        "--temperature",
        type=float,
        default=None,
        help="sampling temperature (default: the config's evaluation.temperature; 0 = greedy)",
    )
    parser.add_argument("--max-items", type=int, default=None, metavar="N", help="only the first N items of each set")
    parser.add_argument("--out", default=None, metavar="FILE", help="also write the JSON summary here")
    parser.add_argument(
        "--items", default=None, metavar="FILE", help="per-item JSONL (default: next to --out, <out>.items.jsonl)"
    )
    parser.add_argument("--config", default=None, metavar="FILE", help="job YAML (backend, sampling, workflow, reward)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="dotted overrides, e.g. rollout.backend=vllm")
    parser.set_defaults(handler=run_eval_cmd)


def run_eval_cmd(args: argparse.Namespace) -> int:
    """Evaluate, print the summary JSON, write ``--out`` and the item JSONL; 1 on a run-time failure."""
    from pathlib import Path

    from areal_tasks.config import load_config
    from areal_tasks.errors import InferenceError, RewardTimeoutError, SchedulerError
    from areal_tasks.evaluation import EvalOptions, run_eval, write_run
    from areal_tasks.evaluation.report import items_path_for
    from areal_tasks.quiet_logs import quiet_third_party_loggers
    from storage.redact import redact_text

    quiet_third_party_loggers()
    cfg = load_config(args.config, args.overrides)
    options = EvalOptions(
        n_samples=args.n_samples, k=args.k, temperature=args.temperature, reward=args.reward, max_items=args.max_items
    )
    out = Path(args.out) if args.out else None
    items = Path(args.items) if args.items else (items_path_for(out) if out is not None else None)
    try:
        run = run_eval(cfg, args.model, args.data, options, progress=not args.no_progress)
    except (InferenceError, SchedulerError, RewardTimeoutError) as exc:  # the run failed; the input was fine
        sys.stderr.write(f"areal eval: failed: {redact_text(str(exc))}\n")
        return 1
    if items is not None:
        run.summary["items_file"] = str(items)
    write_run(run, out, items)
    sys.stdout.write(json.dumps(run.summary, indent=2) + "\n")
    return 0
