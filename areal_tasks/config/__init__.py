"""Job configuration: torch-free dataclass schemas, YAML inheritance, dotted overrides, validation.

    cfg = load_config("configs/demo_grpo.yaml", ["actor.optimizer.lr=1e-5", "ref=null"])
    path = write_resolved(cfg)          # <run_dir>/config.yaml, loads back to an equal config

See ``docs/configuration.md`` for every section and field. Importing this package never imports torch.
"""

from __future__ import annotations

from areal_tasks.config.algorithm import AlgorithmConfig
from areal_tasks.config.cluster import ClusterConfig, RayConfig, SkyPilotConfig, SlurmConfig
from areal_tasks.config.engine import ArchonConfig, EngineConfig, LoRAConfig, LRScheduleConfig, OptimizerConfig
from areal_tasks.config.job import JobConfig
from areal_tasks.config.loader import load_config, resolve_paths
from areal_tasks.config.micro_batch import MicroBatchSpec
from areal_tasks.config.rollout import (
    InferenceServerConfig,
    RewardConfig,
    RolloutConfig,
    SamplingConfig,
    WorkflowConfig,
)
from areal_tasks.config.sections import (
    ColumnsConfig,
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
from areal_tasks.config.serialize import config_hash, config_to_dict, dump_config_yaml, write_resolved
from areal_tasks.config.trace import TraceConfig
from areal_tasks.config.validate import validate_config

__all__ = [
    "AlgorithmConfig",
    "ArchonConfig",
    "ClusterConfig",
    "ColumnsConfig",
    "DatasetConfig",
    "EngineConfig",
    "EvaluationConfig",
    "ExperimentConfig",
    "InferenceServerConfig",
    "JobConfig",
    "LRScheduleConfig",
    "LoRAConfig",
    "MicroBatchSpec",
    "ModelConfig",
    "OptimizerConfig",
    "RayConfig",
    "RecoverConfig",
    "RewardConfig",
    "RolloutConfig",
    "SamplingConfig",
    "SaverConfig",
    "SkyPilotConfig",
    "SlurmConfig",
    "StorageConfig",
    "TraceConfig",
    "TrackingConfig",
    "TrainConfig",
    "WorkflowConfig",
    "config_hash",
    "config_to_dict",
    "dump_config_yaml",
    "load_config",
    "resolve_paths",
    "validate_config",
    "write_resolved",
]
