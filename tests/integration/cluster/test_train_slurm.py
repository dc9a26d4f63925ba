"""``areal train`` from the login host with ``cluster.scheduler=slurm`` on two namespace nodes learns.

The issue's "Done when" for SLURM: the CLI, run on the host (outside the cluster: no ``SLURM_JOB_ID``),
preflights the partition, submits itself as a batch job (``areal_tasks.launch.submit``) and follows
it, relaying the job's log; inside the job the controller runs on the batch host and the two train
ranks run as ``srun`` steps, rank 0 on node 0 and rank 1 on node 1 (``embedded:d1+fsdp:d2`` on two
nodes), over gloo between the nodes. The run starts from the session's SFT warm start
(``warm_start``) with test_learning's RL settings, fewer steps and a smaller eval (this is about the
cluster, not the margin: the RL tests pin learning itself), and the eval reward must rise.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.fixtures.slurm_cluster import SlurmCluster

pytestmark = [pytest.mark.cluster, pytest.mark.slurm, pytest.mark.slow]

CONFIG = "configs/demo_grpo.yaml"
RL_STEPS = 20
#: bounded: the whole run, submit to summary, on a loaded 2-core machine.
RUN_TIMEOUT_S = 900


def slurm_overrides(cluster: SlurmCluster) -> list[str]:
    """The ``cluster.*`` overrides that point a config at the fixture's SLURM."""
    return [
        "cluster.scheduler=slurm",
        "cluster.nodes=2",
        f"cluster.slurm.partition={cluster.partition}",
        f"cluster.slurm.slurm_conf={cluster.conf}",
        "cluster.slurm.time_limit=30",
    ]


def test_areal_train_from_the_login_host_learns_on_two_nodes(
    slurm_cluster: SlurmCluster, warm_start: str, tmp_path: Path, repo_root: Path
) -> None:
    run_dir = tmp_path / "run"
    argv = [
        sys.executable,
        "-m",
        "areal_tasks.cli",
        "train",
        "--config",
        CONFIG,
        *slurm_overrides(slurm_cluster),
        f"experiment.run_dir={run_dir}",
        "experiment.trial=slurm2",
        f"model.path={warm_start}",
        "train.sft_warmup_steps=0",
        f"train.total_steps={RL_STEPS}",
        "actor.optimizer.lr=2e-4",
        "saver.freq_steps=null",
        "evaluation.n_samples=8",
        "rollout.max_head_offpolicyness=0",
    ]
    env = {k: v for k, v in slurm_cluster.env.items() if not k.startswith("SLURM_") or k == "SLURM_CONF"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(repo_root), env.get("PYTHONPATH", "")) if p)
    started = time.perf_counter()
    done = subprocess.run(
        argv, cwd=repo_root, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False
    )
    wall = time.perf_counter() - started
    shown = f"exit {done.returncode}\nstdout:\n{done.stdout[-6000:]}\nstderr:\n{done.stderr[-4000:]}"
    assert done.returncode == 0, shown
    assert "submitted job demo_grpo-slurm2 to slurm" in done.stderr, shown  # it went through submit-and-follow
    assert "job demo_grpo-slurm2 succeeded" in done.stdout, shown
    assert "eval reward" in done.stdout, shown  # the summary table, printed by the follower
    assert (run_dir / "slurm" / "attempt_1.sbatch").is_file()

    summary = json.loads((run_dir / "summary.json").read_text())
    names = [n.name for n in slurm_cluster.nodes]
    assert summary["placement"]["actor"] == names, summary["placement"]  # rank 0 on node 0, rank 1 on node 1
    logs = sorted((run_dir / "logs").rglob("*.log"))
    assert logs, f"no worker logs under {run_dir / 'logs'}"
    print(
        f"\n[test_train_slurm] eval reward {summary['reward_before']:.3f} -> {summary['reward_after']:.3f} "
        f"in {summary['wall_seconds']:.0f} s in the job; areal train from the host {wall:.0f} s"
    )
    assert summary["reward_after"] > summary["reward_before"], summary
