"""The run-directory contract: what a job writes where, and the environment it is handed.

The trainer writes these files, and the Airflow operators, the trigger, the DAG tasks and the CLI
read them, so their names live here once. Torch-free: the DAG processor imports it.

Layout of ``<run_dir>`` (``experiment.run_dir``)::

    config.yaml         the resolved job config (written by the DAG's validate task)
    sft_config.yaml     the config the SFT warm start's workers run (model.path resolved)
    sft_metrics.jsonl   one JSON object per SFT step
    sft/                the warm-started HF model
    rl_config.yaml      the config the RL workers run (model.path = the starting policy)
    rl_metrics.jsonl    one JSON object per RL step (rank 0)
    rollout_episodes.jsonl  per RL step, the batch's episode ids, servers and resubmissions (rank 0)
    sessions.jsonl      the session trace: one line per rollout episode once final (rank 0's rollout side)
    inference_servers.json  the fleet's addresses, written by the controller after it restarted a server
    rl_summary.json     rank 0's end-of-RL figures (the controller merges them into summary.json)
    summary.json        the job's summary (reward before/after, checkpoint, wall time...)
    weights/v<N>/       disk weight updates (the newest few are kept)
    logs/<group>/<rank>.log   each worker's log
"""

from __future__ import annotations

import os
import secrets
from collections.abc import MutableMapping
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "INFERENCE_ADDRESSES_ENV",
    "INFERENCE_SERVERS",
    "MLFLOW_RUN_ID_ENV",
    "RESOLVED_CONFIG",
    "RL_CONFIG",
    "RL_METRICS",
    "RL_SUMMARY",
    "ROLLOUT_EPISODES",
    "SERVER_ADMIN_KEY_ENV",
    "SESSIONS",
    "SFT_CONFIG",
    "SFT_METRICS",
    "SFT_MODEL_DIR",
    "SUMMARY",
    "WEIGHTS_DIR",
    "WORKER_LOGS_DIR",
    "RunPaths",
    "ensure_server_admin_key",
]

#: the resolved job config.
RESOLVED_CONFIG = "config.yaml"
#: the config the SFT warm start's workers run.
SFT_CONFIG = "sft_config.yaml"
#: per-step SFT metrics.
SFT_METRICS = "sft_metrics.jsonl"
#: the warm-started HF model directory.
SFT_MODEL_DIR = "sft"
#: the config the RL workers run.
RL_CONFIG = "rl_config.yaml"
#: per-step RL metrics of rank 0.
RL_METRICS = "rl_metrics.jsonl"
#: the fleet's addresses after a server restart (the rollout client adopts them at the next weight update).
INFERENCE_SERVERS = "inference_servers.json"
#: per RL step: the batch's episode ids ``[epoch, dataset index, sample]``, servers, resubmissions.
ROLLOUT_EPISODES = "rollout_episodes.jsonl"
#: the session trace: one JSON line per rollout episode once it is final (``areal_tasks/trace/sessions.py``).
SESSIONS = "sessions.jsonl"
#: rank 0's end-of-RL figures, merged by the controller into :data:`SUMMARY`.
RL_SUMMARY = "rl_summary.json"
#: the job's summary (the DAG adds the pipeline's figures to it).
SUMMARY = "summary.json"
#: where disk weight updates go (``weights/v<version>``).
WEIGHTS_DIR = "weights"
#: each worker's log: ``logs/<group>/<rank>.log``.
WORKER_LOGS_DIR = "logs"

#: the MLflow run the trainer's callback attaches to (created upstream, e.g. by the DAG).
MLFLOW_RUN_ID_ENV = "AREAL_MLFLOW_RUN_ID"
#: comma-separated ``host:port`` of the inference servers, handed to each RL train worker.
INFERENCE_ADDRESSES_ENV = "AREAL_INFERENCE_ADDRESSES"
#: the admin key a job generates for the inference servers it launches (their API key for vLLM,
#: which has no admin key), used where ``rollout.server.admin_api_key_env`` (vLLM: ``api_key_env``)
#: names no variable. The servers, the train workers and the client read it from the environment.
SERVER_ADMIN_KEY_ENV = "AREAL_SERVER_ADMIN_KEY"


def ensure_server_admin_key(environ: MutableMapping[str, str]) -> None:
    """Put a new random key into ``environ[SERVER_ADMIN_KEY_ENV]`` unless one is there (the job's
    key: the first launch of a job's servers makes it, its restarts and later fleets reuse it; a
    new job process makes a new one). Never logged, never on a command line."""
    if not environ.get(SERVER_ADMIN_KEY_ENV):
        environ[SERVER_ADMIN_KEY_ENV] = secrets.token_urlsafe(32)


@dataclass(frozen=True)
class RunPaths:
    """Every path of the contract under one run directory."""

    root: Path

    @classmethod
    def of(cls, run_dir: str | os.PathLike[str] | None) -> RunPaths:
        """The paths under ``run_dir`` (the working directory when it is None or empty)."""
        return cls(Path(run_dir or "."))

    @property
    def resolved_config(self) -> Path:
        return self.root / RESOLVED_CONFIG

    @property
    def sft_config(self) -> Path:
        return self.root / SFT_CONFIG

    @property
    def sft_metrics(self) -> Path:
        return self.root / SFT_METRICS

    @property
    def sft_model(self) -> Path:
        return self.root / SFT_MODEL_DIR

    @property
    def rl_config(self) -> Path:
        return self.root / RL_CONFIG

    @property
    def rl_metrics(self) -> Path:
        return self.root / RL_METRICS

    @property
    def inference_servers(self) -> Path:
        return self.root / INFERENCE_SERVERS

    @property
    def rollout_episodes(self) -> Path:
        return self.root / ROLLOUT_EPISODES

    @property
    def sessions(self) -> Path:
        return self.root / SESSIONS

    @property
    def rl_summary(self) -> Path:
        return self.root / RL_SUMMARY

    @property
    def summary(self) -> Path:
        return self.root / SUMMARY

    @property
    def weights(self) -> Path:
        return self.root / WEIGHTS_DIR

    def worker_log(self, group: str, rank: int) -> Path:
        """The log file of ``rank`` of worker group ``group``."""
        return self.root / WORKER_LOGS_DIR / group / f"{rank}.log"
