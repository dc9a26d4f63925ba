"""``JobConfig``: the root of a job's configuration, one field per section.

Torch-free. Build one with :func:`areal_tasks.config.load_config`, which merges YAML files and
overrides, resolves the run directory and validates across sections.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from areal_tasks.config.algorithm import AlgorithmConfig, GRPOConfig
from areal_tasks.config.cluster import ClusterConfig
from areal_tasks.config.engine import EngineConfig
from areal_tasks.config.rollout import RolloutConfig
from areal_tasks.config.sections import (
    DatasetConfig,
    EvaluationConfig,
    ExperimentConfig,
    ModelConfig,
    RecoverConfig,
    SaverConfig,
    StorageConfig,
    TrackingConfig,
    TrainConfig,
)
from areal_tasks.config.trace import TraceConfig

logger = logging.getLogger(__name__)

#: the default allocation: one embedded inference server and one FSDP train worker.
DEFAULT_ALLOCATION = "embedded:d1+fsdp:d1"


@dataclass
class JobConfig:
    """A whole RL job."""

    #: names and run directory.
    experiment: ExperimentConfig = field(default_factory=ExperimentConfig)
    #: machines.
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    #: checkpoint / artifact storage.
    storage: StorageConfig = field(default_factory=StorageConfig)
    #: how GPUs (or CPU worker processes) are split between inference and training (see "Allocation mode").
    allocation: str = DEFAULT_ALLOCATION
    #: the policy model.
    model: ModelConfig = field(default_factory=ModelConfig)
    #: the policy's train engine.
    actor: EngineConfig = field(default_factory=EngineConfig)
    #: frozen reference model engine (for a KL term); None = no reference model.
    ref: EngineConfig | None = None
    #: critic (value model) engine; None = no critic (required by algorithms that need one).
    critic: EngineConfig | None = None
    #: rollout generation.
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    #: prompts.
    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    #: steps and batch size.
    train: TrainConfig = field(default_factory=TrainConfig)
    #: the RL algorithm, selected by ``algorithm.name``; the other keys depend on it.
    algorithm: AlgorithmConfig = field(default_factory=GRPOConfig)
    #: checkpoint saving.
    saver: SaverConfig = field(default_factory=SaverConfig)
    #: resuming from a checkpoint.
    recover: RecoverConfig = field(default_factory=RecoverConfig)
    #: periodic evaluation.
    evaluation: EvaluationConfig = field(default_factory=EvaluationConfig)
    #: metrics tracking.
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    #: perf spans and the per-episode session log (docs/tracing.md).
    trace: TraceConfig = field(default_factory=TraceConfig)
