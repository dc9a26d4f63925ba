"""Rollout config: inference backend, sampling, concurrency/staleness and the server processes.

Torch-free. Sampling parameters map onto the SGLang ``sampling_params`` of ``/generate``.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from areal_tasks.api.run_dir import SERVER_ADMIN_KEY_ENV
from areal_tasks.config.sections import DType
from areal_tasks.errors import ConfigError

logger = logging.getLogger(__name__)


@dataclass
class SamplingConfig:
    """Generation parameters for training rollouts."""

    #: softmax temperature; 0 = greedy.
    temperature: float = 1.0
    #: nucleus sampling mass, in (0, 1].
    top_p: float = 1.0
    #: sample from the top k tokens; -1 = no limit.
    top_k: int = -1
    #: maximum generated tokens per sample.
    max_new_tokens: int = 256
    #: stop strings (not included in the output).
    stop: list[str] = field(default_factory=list)
    #: stop token ids (in addition to EOS).
    stop_token_ids: list[int] = field(default_factory=list)
    #: keep generating past EOS until ``max_new_tokens``.
    ignore_eos: bool = False
    #: sampling seed; None = nondeterministic (with ``per_sample``: the base of the per-sample seeds).
    seed: int | None = None
    #: ``shared``: every request carries ``seed`` (None: draws from the server's stream);
    #: ``per_sample``: each request gets a seed derived from ``seed`` (else ``experiment.seed``), the
    #: prompt's data position, the sample and the turn, and batches come in data order (deterministic
    #: rollouts; see docs/rollout.md).
    seed_mode: Literal["shared", "per_sample"] = "shared"


@dataclass
class InferenceServerConfig:
    """Inference server processes (embedded, SGLang or vLLM)."""

    #: Python interpreter that runs the server (e.g. a separate vLLM venv); None = the current one.
    python: str | None = None
    #: fraction of accelerator memory the server may use (weights + KV cache).
    mem_fraction: float = 0.8
    #: maximum context length (prompt + generation); None = the model's.
    context_length: int | None = None
    #: server weight dtype; ``auto`` = ``model.dtype``.
    dtype: DType = "auto"
    #: extra command-line arguments passed to the server unchanged.
    extra_args: list[str] = field(default_factory=list)
    #: seconds to wait for a started server to report healthy.
    startup_timeout_s: float = 600.0
    #: restarts allowed per server before the job fails.
    max_restarts: int = 2
    #: name of the environment variable holding the servers' API key (every endpoint needs it);
    #: None = no key. The key itself never goes into a config file.
    api_key_env: str | None = None
    #: name of the environment variable holding the admin API key (pause/resume, weight updates,
    #: aborts); None = the key the job generates for its servers (``AREAL_SERVER_ADMIN_KEY``). Not
    #: for vLLM (it has no admin key: the generated key is its API key unless ``api_key_env`` is set).
    admin_api_key_env: str | None = None
    #: directories the servers may load weight updates from besides the served model's and the
    #: run's ``weights/`` (a disk update elsewhere is refused).
    weight_roots: list[str] = field(default_factory=list)

    def key_envs(self, backend: str) -> tuple[str | None, str | None]:
        """``(API key variable, admin key variable)`` of ``backend``'s servers: the configured
        names, with the job's generated key (``AREAL_SERVER_ADMIN_KEY``) as the admin key (vLLM:
        as the API key, when ``api_key_env`` is unset), so a job's servers are never open."""
        if backend == "vllm":
            return self.api_key_env or SERVER_ADMIN_KEY_ENV, self.admin_api_key_env
        return self.api_key_env, self.admin_api_key_env or SERVER_ADMIN_KEY_ENV

    def read_keys(self, environ: Mapping[str, str], backend: str = "embedded") -> tuple[str | None, str | None]:
        """``(api_key, admin_api_key)`` of ``backend``'s servers read from ``environ`` (e.g.
        ``os.environ``): the variables :meth:`key_envs` names. The generated key is None while it
        is unset (before the job's servers start, or servers the job did not launch).

        Raises ConfigError naming the variable when a configured variable is unset or empty. Never
        called while a config is loaded: loading stays pure.
        """
        keys: list[str | None] = []
        for field_name, name in zip(("api_key_env", "admin_api_key_env"), self.key_envs(backend)):
            if name is None:
                keys.append(None)
                continue
            value = environ.get(name, "")
            if name == SERVER_ADMIN_KEY_ENV and name != getattr(self, field_name):
                keys.append(value or None)
                continue
            if not value:
                raise ConfigError(
                    f"rollout.server.{field_name}={name!r}: the environment variable {name} is "
                    f"{'empty' if name in environ else 'not set'}; export the key as {name} where the job "
                    f"starts (or set rollout.server.{field_name}: null for a server without that key)"
                )
            keys.append(value)
        return keys[0], keys[1]


#: what an environment variable name may look like (POSIX portable names).
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass
class WorkflowConfig:
    """The rollout workflow that turns one prompt into one trajectory."""

    #: a registered workflow (``rlvr``, ``multi_turn``: docs/workflows.md lists them and their
    #: options) or an import path ``package.module:factory`` of your own.
    name: str = "rlvr"
    #: the system turn of every prompt (training, evaluation, the SFT warm start); null = the task's
    #: default, an empty string = no system turn.
    system_prompt: str | None = None
    #: the workflow's own options (keyword arguments of its factory), checked against the ones it
    #: takes before the job starts; e.g. ``multi_turn``: ``max_turns``, ``turn_discount``, ``feedback``.
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class RewardConfig:
    """The reward function and the process pool that runs it."""

    #: a registered reward (``arithmetic``, ``exact_match``, ``numeric``, ``math_verify``) or an
    #: import path ``package.module:function`` of ``fn(completion, answer, **kwargs) -> float``.
    fn: str = "arithmetic"
    #: reward worker processes; 0 = run in the rollout process (a hanging reward cannot be killed).
    workers: int = 1
    #: seconds one reward call may take; a call past it fails its episode.
    timeout_s: float = 15.0


@dataclass
class RolloutConfig:
    """Asynchronous rollout: how trajectories are generated and how stale they may be."""

    #: inference backend; must match the allocation's inference backend. The choices are those of
    #: ``areal_tasks.inference.registry`` (a unit test keeps this list equal to it).
    backend: Literal["embedded", "sglang", "vllm"] = "embedded"
    #: samples generated per prompt (the group of GRPO-style algorithms).
    group_size: int = 4
    #: maximum trajectories in flight at once.
    max_concurrent_rollouts: int = 32
    #: how many policy versions a trajectory may lag the trainer; 0 = synchronous RL.
    max_head_offpolicyness: int = 0
    #: what ``max_head_offpolicyness`` bounds: ``sample`` = every trained sample (a batch waits for a
    #: slow group whose staleness deadline has come); ``admission`` = only when a group may start
    #: (AReaL's rule): batches take finished groups in completion order and never wait for a slow one,
    #: so a long-tail group may be trained staler than the bound (counted in ``late_samples``).
    staleness_bound: Literal["sample", "admission"] = "sample"
    #: seconds before one generation request times out.
    request_timeout_s: float = 600.0
    #: retries of a failed generation request.
    max_retries: int = 3
    #: sampling parameters.
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    #: server processes.
    server: InferenceServerConfig = field(default_factory=InferenceServerConfig)
    #: fraction of failed episodes (over a recent window) past which the rollout executor fails the job.
    max_failure_rate: float = 0.5
    #: how new weights reach the servers each step: sharded safetensors on disk, a broadcast over a
    #: collective group (gloo on CPU, NCCL on GPU), or ``shared``: the trainer's buffers in memory the
    #: servers on its host map (CUDA IPC on the trainer's GPUs; a /dev/shm file on CPU; embedded backend).
    weight_update: Literal["disk", "collective", "shared"] = "disk"
    #: how the servers stop for a weight update: ``abort`` returns in-flight requests' partial output,
    #: resubmitted after it (their prefix is recomputed with the new weights); ``in_place`` keeps them
    #: and their KV cache (no resubmission: the shortest pause; the prefix's KV stays the old policy's);
    #: ``retract`` moves them back to the queue, keeping the KV the server can hold. SGLang and the
    #: embedded server tag each token with its version; vLLM does not, so a request it keeps across
    #: an update is tagged whole with the newer version.
    pause_mode: Literal["abort", "retract", "in_place"] = "abort"
    #: run the rollout side (client, executor, rewards, evaluation) of train rank 0 in a child process,
    #: so its event loop does not compete with the training step for rank 0's interpreter; ``auto`` =
    #: when training runs on GPUs (on CPU the cores, not the interpreter, are what both share).
    own_process: Literal["auto", "on", "off"] = "auto"
    #: the episode logic.
    workflow: WorkflowConfig = field(default_factory=WorkflowConfig)
    #: the reward function.
    reward: RewardConfig = field(default_factory=RewardConfig)
