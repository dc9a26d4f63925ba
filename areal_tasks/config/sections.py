"""Small job-level config sections: experiment, storage, model, dataset, train, saver,
recover, evaluation, tracking. Torch-free plain dataclasses; cross-field rules live in
:mod:`areal_tasks.config.validate`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Literal

logger = logging.getLogger(__name__)

#: numeric precision of weights / activations; ``auto`` = the model's own (fp32 on CPU).
DType = Literal["auto", "float32", "bfloat16", "float16"]


@dataclass
class ExperimentConfig:
    """Names the run and where its files go."""

    #: experiment name (groups trials; also the default MLflow experiment).
    name: str = "areal"
    #: trial name within the experiment (one training run).
    trial: str = "trial0"
    #: the run directory; None = ``runs/<name>/<trial>`` under the current directory. Made absolute.
    run_dir: str | None = None
    #: global random seed.
    seed: int = 1


@dataclass
class StorageConfig:
    """Where checkpoints, weight updates and artifacts are stored (an fsspec URL)."""

    #: storage root, e.g. ``file:///nfs/x`` or ``s3://bucket/prefix``; None = ``file://<run_dir>/storage``.
    url: str | None = None
    #: fsspec storage options (endpoint, credentials profile, ...), passed through unchanged.
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class ModelConfig:
    """The policy model to post-train."""

    #: a HuggingFace hub id, a local directory, or ``tiny:<family>`` for the built-in tiny-model kit.
    path: str = "tiny:qwen2"
    #: tokenizer location; None = same as ``path``.
    tokenizer_path: str | None = None
    #: weight dtype.
    dtype: DType = "auto"
    #: allow model code from the hub (HF ``trust_remote_code``).
    trust_remote_code: bool = False
    #: attention kernel (HF ``attn_implementation``, e.g. ``sdpa``); None = library default.
    attn_implementation: str | None = None


@dataclass
class ColumnsConfig:
    """Which column of a data file holds each part of a record (``docs/datasets.md``)."""

    #: column holding the prompt text; not read when ``messages`` is set.
    prompt: str | None = "prompt"
    #: column holding a chat (a list of ``{role, content}``) rendered through the chat template instead
    #: of ``prompt``; a system message of its own replaces the job's system prompt. null = none.
    messages: str | None = None
    #: column holding the reference answer (passed to the reward as text); null = none (then ``tests``).
    answer: str | None = "answer"
    #: column holding unit tests (passed to the reward as ``tests=``, e.g. for ``code_tests``); null = none.
    tests: str | None = None
    #: column(s) passed to the reward as ``metadata=`` (one column, or a list: a mapping by column name).
    metadata: list[str] | str | None = None
    #: column holding the prompt's images (an HF ``Image`` feature, a list of them, PNG/JPEG bytes, or
    #: file paths relative to the data's folder), shown before the prompt by the ``vision`` workflow;
    #: null = none.
    images: str | None = None


@dataclass
class DatasetConfig:
    """Prompts to train (and optionally evaluate) on: a demo set or data files (``docs/datasets.md``)."""

    #: training data: ``demo:<name>`` (a built-in demo set), or a parquet / JSON / JSONL / Arrow file, a
    #: glob or directory of such shards, or a ``save_to_disk`` directory: a local path or a ``file://`` /
    #: ``s3://`` URL.
    path: str = "demo:arithmetic"
    #: evaluation data (same forms as ``path``); None = no separate eval set.
    eval_path: str | None = None
    #: prompts longer than this many tokens (rendered through the chat template) are dropped.
    max_prompt_len: int = 256
    #: shuffle the training prompts every epoch (seeded by ``experiment.seed`` and the epoch).
    shuffle: bool = True
    #: which columns hold the prompt (or chat), answer, tests and metadata.
    columns: ColumnsConfig = field(default_factory=ColumnsConfig)
    #: read the training data as a stream (never all in memory) instead of loading it.
    streaming: bool = False
    #: storage options for ``s3://`` data URLs (names as ``storage.options``; missing ones come from
    #: the AWS environment).
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class TrainConfig:
    """Length and batch size of training."""

    #: samples (trajectories) per training step; a multiple of ``rollout.group_size``.
    batch_size: int = 16
    #: number of training steps.
    total_steps: int = 100
    #: cap on passes over the dataset (training stops at whichever of this and ``total_steps`` comes first);
    #: None = no cap.
    epochs: int | None = None
    #: supervised (SFT) steps on the reference answers before RL starts.
    sft_warmup_steps: int = 0
    #: peak learning rate of the SFT warm start; None = ``actor.optimizer.lr`` (RL usually wants a
    #: much smaller one than a warm start from random weights).
    sft_lr: float | None = None
    #: LR schedule of the SFT warm start (``actor.lr_schedule``'s warmup settings apply).
    sft_lr_schedule: Literal["constant", "linear", "cosine"] = "cosine"


@dataclass
class SaverConfig:
    """Checkpointing for recovery and export."""

    #: save every this many steps; None = only at the end.
    freq_steps: int | None = None
    #: keep the newest this many checkpoints (older ones are deleted).
    keep_last: int = 2
    #: additionally keep every checkpoint whose step is a multiple of this; None = none.
    keep_every: int | None = None
    #: additionally keep the checkpoint with the highest value of this metric; None = none.
    keep_best_metric: str | None = None
    #: write checkpoints in the background while training continues.
    async_save: bool = False
    #: ``dcp`` (sharded torch.distributed.checkpoint, resumable) or ``hf`` (HuggingFace safetensors).
    format: Literal["dcp", "hf"] = "dcp"


@dataclass
class RecoverConfig:
    """What to do when the run directory already holds a checkpoint."""

    #: ``auto`` = resume if a checkpoint exists, else start; ``resume`` = a checkpoint must exist;
    #: ``disabled`` = start fresh.
    mode: Literal["auto", "resume", "disabled"] = "auto"
    #: check every tensor item of the checkpoint against its sha256 while loading it (a damaged one is
    #: quarantined and the next older one used); false skips every hash check (docs/checkpoints.md: cost).
    verify: bool = True


@dataclass
class EvaluationConfig:
    """Periodic evaluation during training."""

    #: evaluate every this many steps; None = no periodic evaluation.
    freq_steps: int | None = None
    #: generations per eval prompt.
    n_samples: int = 1
    #: evaluate on at most this many prompts; None = all.
    max_eval_prompts: int | None = None
    #: sampling temperature for evaluation (0 = greedy).
    temperature: float = 0.0


@dataclass
class TrackingConfig:
    """Metrics tracking."""

    #: MLflow tracking URI (``sqlite:///path/mlflow.db``, ``http://host:5000``...); None = no MLflow.
    mlflow_uri: str | None = None
    #: MLflow experiment name; None = ``experiment.name``.
    mlflow_experiment: str | None = None
    #: where a new MLflow experiment keeps its artifacts (a path or URI); None = the tracking
    #: store's default (a server's artifact root; for a ``sqlite:`` URI, ``./mlruns`` of the working directory).
    mlflow_artifact_location: str | None = None
    #: log metrics every this many steps.
    log_every: int = 1
    #: also append metrics to ``<run_dir>/rl_metrics.jsonl``.
    jsonl: bool = True
