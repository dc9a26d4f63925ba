"""A train rank SIGKILLed mid-step; the Airflow operator's retry resumes; the weights equal an
uninterrupted run's (issue #26, item 7).

The job is the deterministic tiny RL job of ``tests/fixtures/faults.py`` (per-sample seeds, eta 0,
batches in data order, one request at a time per server), 6 steps, a checkpoint every 2. First a
reference run without a fault. Then :class:`AReaLTrainingOperator` (not deferrable: it polls in
this thread; the job name depends only on the DAG, run and task ids, as in Airflow) runs the same
job with ``AREAL_FAULTS`` set so that rank 1 SIGKILLs itself in step 4, after the forward passes and
advantages and before the actor update: try 1 must fail with rank 1's log tail in its error. A
fresh operator is try 2: it resubmits the job with ``recover.mode=auto``, which resumes from the
checkpoint of step 2 and finishes. Its final weights must equal the reference's bit for bit, the
weights must have moved from the initial ones (so the equality means something), and every step
must have trained on the same episodes as the reference.

The full Airflow path (scheduler, triggerer, REST) stays covered by tests/integration/airflow/test_retry.py.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch

from areal_tasks.api.faults import FAULTS_ENV
from areal_tasks.launch.jobs import LocalJobs
from tests.fixtures.faults import DETERMINISTIC, REPO, TrainJob, episode_ids_by_step, final_weights, metrics_rows

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.distributed, pytest.mark.timeout(600)]

STEPS = 6
KILL_STEP = 4
OVERRIDES = [
    *DETERMINISTIC,
    "allocation=embedded:d1+fsdp:d2",
    f"train.total_steps={STEPS}",
    "saver.freq_steps=2",
]
RUN_TIMEOUT_S = 240.0


def _initial_weights(model_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(model_dir / "model.safetensors"))


def test_rank_killed_mid_step_then_retry_resumes_to_equal_weights(
    tmp_path: Path, tiny_qwen2: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("airflow.sdk")
    from operators.exceptions import ArealAirflowError
    from operators.operators.training import AReaLTrainingOperator, job_name_for
    from tests.unit.operators.conftest import make_context

    started = time.monotonic()
    with TrainJob(tmp_path / "reference", OVERRIDES) as reference:
        assert reference.wait(RUN_TIMEOUT_S) == 0, reference.log_tail()
    reference_s = time.monotonic() - started
    ref_step, ref_weights = final_weights(tmp_path / "reference")
    assert ref_step == STEPS
    initial = _initial_weights(tiny_qwen2)
    moved = [name for name, value in ref_weights.items() if name in initial and not torch.equal(value, initial[name])]
    assert len(moved) >= len(ref_weights) // 2, (
        f"training barely moved the weights ({moved}): the test would be vacuous"
    )
    assert len({round(r["reward/mean"], 6) for r in metrics_rows(tmp_path / "reference")}) > 1

    fired = tmp_path / "fired"
    monkeypatch.setenv(FAULTS_ENV, f"rl.step.before_update:rank=1:step={KILL_STEP}:action=sigkill:once={fired}")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.chdir(REPO)
    jobs_root, run_dir = tmp_path / "jobs", tmp_path / "run"
    name = job_name_for("areal_rl_training", "manual__2026-01-02T03:04:05+00:00", "train")

    def operator() -> AReaLTrainingOperator:
        return AReaLTrainingOperator(
            task_id="train",
            config="configs/demo_grpo.yaml",
            overrides=OVERRIDES,
            jobs_root=str(jobs_root),
            run_dir=str(run_dir),
            poll_interval=0.5,
            deferrable=False,
            cancel_grace_s=10.0,
        )

    jobs = LocalJobs(jobs_root)
    try:
        with pytest.raises(ArealAirflowError) as failure:
            operator().execute(make_context())
        assert fired.is_file(), "the fault point never fired"
        detect_s = time.time() - fired.stat().st_mtime  # the fault point creates the file, then kills
        message = str(failure.value)
        assert f"fault rl.step.before_update fired on rank 1 (step={KILL_STEP})" in message, message
        assert "rl/1" in message or "rank 1" in message, message
        assert jobs.status(name).state == "failed"
        rows = metrics_rows(run_dir)
        assert [r["step"] for r in rows] == list(range(1, KILL_STEP)), rows

        retried_at = time.monotonic()
        result = operator().execute(make_context())  # Airflow's try 2: the same job name
        recovered_s = time.monotonic() - retried_at
    finally:
        for folder in jobs_root.iterdir() if jobs_root.is_dir() else []:
            if folder.is_dir() and jobs.status(folder.name).state == "running":
                jobs.cancel(folder.name, grace_s=5.0)

    status = jobs.status(name)
    assert status.state == "succeeded" and status.attempt == 2
    summary = result["summary"]
    assert summary["first_step"] == 3 and summary["steps"] == STEPS, summary
    step, weights = final_weights(run_dir)
    assert step == STEPS
    assert sorted(weights) == sorted(ref_weights)
    different = [n for n in weights if not torch.equal(weights[n], ref_weights[n])]
    assert not different, f"tensors differ from the uninterrupted run: {different}"
    assert episode_ids_by_step(run_dir) == episode_ids_by_step(tmp_path / "reference")
    print(
        f"[fault-timing] rank killed mid-step: reference run {reference_s:.1f} s; failure seen by the operator "
        f"{detect_s:.1f} s after the kill; retry resumed at step 3 and "
        f"finished {STEPS - 2} steps in {recovered_s:.1f} s"
    )
