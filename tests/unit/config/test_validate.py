"""Cross-field validation: each rule fires with a message naming the field, and all are reported at once."""

from __future__ import annotations

import dataclasses

import pytest

from areal_tasks.config import JobConfig, MicroBatchSpec, load_config, validate_config
from areal_tasks.config.validate import collect_problems, uses_groups
from areal_tasks.errors import ConfigError

CASES: list[tuple[list[str], str]] = [
    # batch and group sizes
    (["train.batch_size=10"], "train.batch_size: must be a positive multiple of rollout.group_size=4"),
    (["train.batch_size=0"], "train.batch_size: must be >= 1, got 0"),
    (["rollout.group_size=1", "train.batch_size=16"], "rollout.group_size: algorithm 'grpo' compares samples"),
    (["actor.ppo_n_minibatches=3"], "actor.ppo_n_minibatches: must divide train.batch_size=16, got 3"),
    (["actor.micro_batch.granularity=3"], "actor.micro_batch.granularity: must divide the mini-batch size"),
    # algorithm vs engines
    (["algorithm.name=ppo"], "critic: algorithm 'ppo' needs a critic"),
    (["critic.value_head=true"], "critic: algorithm 'grpo' does not use a critic"),
    (["algorithm.name=ppo", "critic.backend=fsdp"], "critic.value_head: the critic needs a value head"),
    (["actor.value_head=true"], "actor.value_head: only the critic has a value head"),
    (["algorithm.kl_coef=0.1"], "ref: algorithm.kl_coef=0.1 needs a reference model"),
    # allocation
    (["allocation=embedded:d1+"], "allocation: invalid allocation spec"),
    (["allocation=vllm:d1+fsdp:d1"], "rollout.backend: must match the allocation's inference backend 'vllm'"),
    (
        ["allocation=embedded:d1+megatron:d1", "cluster.gpus_per_node=8"],
        "actor.backend: must match the allocation's training backend 'megatron'",
    ),
    (
        ["allocation=embedded:d2+fsdp:d4", "cluster.gpus_per_node=4"],
        "allocation: 'embedded:d2+fsdp:d4' needs 6 GPUs but the cluster has cluster.nodes * cluster.gpus_per_node = 4",
    ),
    (["allocation=embedded:d1+fsdp:d3"], "allocation: the actor's data-parallel size d3 must divide"),
    (["allocation=fsdp:d1"], "allocation: 'fsdp:d1' has no inference component"),
    # training backends and dims that are not built (the engine registry's)
    (
        ["actor.backend=megatron"],
        "actor.backend: training backend 'megatron' is not built; built training backends: archon, fsdp",
    ),
    (
        ["algorithm.kl_coef=0.1", "ref.backend=megatron"],
        "ref.backend: training backend 'megatron' is not built; built training backends: archon, fsdp",
    ),
    (
        ["allocation=embedded:d1+archon:d2e4", "actor.backend=archon"],
        "allocation: invalid allocation spec: expert parallelism e4 does not divide d*c = 2",
    ),
    (["allocation=embedded:d1+fsdp:d2p2"], "fsdp runs d (data), t (tensor) and c (context)"),
    (["allocation=embedded:d1+fsdp:d2e2"], "fsdp runs d (data), t (tensor) and c (context)"),
    (
        ["allocation=embedded[rollout]:d1+fsdp[actor]:d2+fsdp[ref]:d1", "algorithm.kl_coef=0.1", "ref.backend=fsdp"],
        "allocation: the ref component 'fsdp[ref]:d1' spans 1 ranks, but the trainer runs every engine on the actor's",
    ),
    (["allocation=embedded:d1"], "allocation: 'embedded:d1' has no training component"),
    (
        [
            "allocation=embedded[rollout]:d1|fsdp[actor]:d1",
            "cluster.gpus_per_node=1",
            "rollout.weight_update=collective",
        ],
        "rollout.weight_update: 'collective' cannot reach servers on the trainer's own GPUs",
    ),
    (
        ["allocation=vllm:d1+fsdp:d1", "rollout.backend=vllm", "rollout.weight_update=shared"],
        "rollout.weight_update: 'shared' needs the embedded inference server; 'vllm' servers cannot read",
    ),
    (
        ["allocation=embedded:d1+fsdp:d1", "cluster.gpus_per_node=2", "rollout.weight_update=shared"],
        "rollout.weight_update: 'shared' reads the trainer's buffers on its own GPUs, but in 'embedded:d1+fsdp:d1'",
    ),
    (
        ["allocation=embedded:d2+fsdp:d2", "cluster.nodes=2", "rollout.weight_update=shared"],
        "rollout.weight_update: 'shared' on CPU reads one file on the trainer's host, but cluster.nodes is 2",
    ),
    (["allocation=sglang:d1+fsdp:d1", "rollout.backend=sglang"], "backend 'sglang' needs GPUs"),
    (
        ["allocation=embedded[rollout]:d1+fsdp[actor]:d1+fsdp[critic]:d1"],
        "critic: the allocation places a 'critic' component",
    ),
    # lengths
    (
        ["actor.micro_batch.max_tokens_per_mb=100"],
        "actor.micro_batch.max_tokens_per_mb: must fit one whole sequence (dataset.max_prompt_len + "
        "rollout.sampling.max_new_tokens = 512), got 100",
    ),
    (["ref.micro_batch.max_tokens_per_mb=100"], "ref.micro_batch.max_tokens_per_mb: must fit one whole sequence"),
    (
        ["actor.micro_batch.max_tokens_per_mb=1024", "actor.micro_batch.memory_budget_gb=4"],
        "actor.micro_batch: set max_tokens_per_mb or memory_budget_gb",
    ),
    (["rollout.server.context_length=300"], "rollout.server.context_length: must be >= dataset.max_prompt_len"),
    (["actor.lr_schedule.warmup_steps=100"], "actor.lr_schedule.warmup_steps: must be < train.total_steps=100"),
    (
        ["actor.lr_schedule.warmup_steps=5", "actor.lr_schedule.warmup_ratio=0.1"],
        "actor.lr_schedule: set warmup_steps or warmup_ratio, not both",
    ),
    # rollout
    (["rollout.max_head_offpolicyness=-1"], "rollout.max_head_offpolicyness: must be >= 0"),
    (["rollout.max_concurrent_rollouts=2"], "rollout.max_concurrent_rollouts: must be >= rollout.group_size=4"),
    (["rollout.sampling.top_p=0"], "rollout.sampling.top_p: must be > 0 and <= 1"),
    (["rollout.sampling.top_p=1.5"], "rollout.sampling.top_p: must be > 0 and <= 1"),
    (["rollout.sampling.temperature=-0.1"], "rollout.sampling.temperature: must be >= 0"),
    (["rollout.sampling.top_k=0"], "rollout.sampling.top_k: must be -1 (no limit) or >= 1"),
    (["rollout.sampling.max_new_tokens=0"], "rollout.sampling.max_new_tokens: must be >= 1"),
    (["rollout.sampling.stop=['']"], "rollout.sampling.stop[0]: stop strings must be non-empty"),
    (["rollout.sampling.stop_token_ids=[-1]"], "rollout.sampling.stop_token_ids[0]: must be >= 0"),
    (["rollout.max_failure_rate=1.5"], "rollout.max_failure_rate: must be >= 0 and <= 1"),
    (["rollout.request_timeout_s=0"], "rollout.request_timeout_s: must be > 0"),
    (["rollout.max_retries=-1"], "rollout.max_retries: must be >= 0"),
    (["rollout.server.mem_fraction=0"], "rollout.server.mem_fraction: must be > 0 and <= 1"),
    (["rollout.server.python=' '"], "rollout.server.python: must be a non-empty string"),
    (["rollout.server.startup_timeout_s=0"], "rollout.server.startup_timeout_s: must be > 0"),
    (["rollout.server.max_restarts=-1"], "rollout.server.max_restarts: must be >= 0"),
    (["rollout.server.api_key_env=sk-123"], "rollout.server.api_key_env: must name an environment variable"),
    (["rollout.server.admin_api_key_env='9LIVES'"], "rollout.server.admin_api_key_env: must name an environment"),
    (
        ["allocation=vllm:d1+fsdp:d1", "rollout.backend=vllm", "rollout.server.admin_api_key_env=ADMIN"],
        "rollout.server.admin_api_key_env: vLLM has no admin key",
    ),
    # engines
    (["actor.optimizer.lr=0"], "actor.optimizer.lr: must be > 0"),
    (["actor.optimizer.beta2=1"], "actor.optimizer.beta2: must be >= 0 and < 1"),
    (["actor.optimizer.eps=0"], "actor.optimizer.eps: must be > 0"),
    (["actor.optimizer.grad_clip=-1"], "actor.optimizer.grad_clip: must be >= 0"),
    (["actor.optimizer.weight_decay=-1"], "actor.optimizer.weight_decay: must be >= 0"),
    (["actor.lr_schedule.min_lr_ratio=2"], "actor.lr_schedule.min_lr_ratio: must be >= 0 and <= 1"),
    (["actor.lr_schedule.warmup_ratio=1"], "actor.lr_schedule.warmup_ratio: must be >= 0 and < 1"),
    (["actor.ppo_n_minibatches=0"], "actor.ppo_n_minibatches: must be >= 1"),
    (["actor.lora.enabled=true", "actor.lora.rank=0"], "actor.lora.rank: must be >= 1"),
    (["actor.lora.enabled=true", "actor.lora.dropout=1"], "actor.lora.dropout: must be >= 0 and < 1"),
    (["actor.lora.enabled=true", "actor.lora.target_modules=[]"], "actor.lora.target_modules: must list"),
    # job-level sections
    (["experiment.name=a/b"], "experiment.name: becomes a directory name"),
    (["experiment.trial=.."], "experiment.trial: becomes a directory name"),
    (["experiment.name=''"], "experiment.name: must be a non-empty string"),
    (["experiment.seed=-1"], "experiment.seed: must be >= 0"),
    (["cluster.nodes=0"], "cluster.nodes: must be >= 1"),
    (["cluster.nodes=2"], "cluster.nodes: the local scheduler runs on one node"),
    (["cluster.gpus_per_node=-1"], "cluster.gpus_per_node: must be >= 0"),
    (["cluster.cpus_per_node=0"], "cluster.cpus_per_node: must be >= 1 (or null)"),
    (["cluster.memory_gb_per_node=0"], "cluster.memory_gb_per_node: must be > 0 (or null)"),
    (["storage.url=''"], "storage.url: must be a non-empty string"),
    (["model.path=tiny:"], "model.path: a tiny model needs a family"),
    (["dataset.max_prompt_len=0"], "dataset.max_prompt_len: must be >= 1"),
    (["dataset.columns.prompt=''"], "dataset.columns.prompt: must be a non-empty string"),
    (["dataset.columns.prompt=null"], "name a prompt column (columns.prompt) or a chat column"),
    (["dataset.columns.answer=null"], "name an answer column (columns.answer) or a tests column"),
    (["dataset.streaming=true"], "dataset.streaming: a demo set (demo:arithmetic) is generated in memory"),
    (["dataset.columns.metadata=[]"], "dataset.columns.metadata: must be a column name, a non-empty list"),
    (["train.total_steps=0"], "train.total_steps: must be >= 1"),
    (["train.epochs=0"], "train.epochs: must be >= 1 (or null)"),
    (["train.sft_warmup_steps=100"], "train.sft_warmup_steps: must be < train.total_steps=100"),
    (["saver.freq_steps=0"], "saver.freq_steps: must be >= 1 (or null)"),
    (["saver.keep_last=0"], "saver.keep_last: must be >= 1"),
    (["saver.keep_every=0"], "saver.keep_every: must be >= 1 (or null)"),
    (["evaluation.freq_steps=5"], "evaluation.freq_steps: periodic evaluation needs an eval set"),
    (["evaluation.n_samples=0"], "evaluation.n_samples: must be >= 1"),
    (["evaluation.temperature=-1"], "evaluation.temperature: must be >= 0"),
    (["tracking.log_every=0"], "tracking.log_every: must be >= 1"),
]


@pytest.mark.parametrize(("overrides", "expected"), CASES, ids=[" ".join(o) for o, _ in CASES])
def test_rule_fires_with_field_named(overrides: list[str], expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, overrides)
    assert expected in str(info.value)


def test_defaults_are_valid() -> None:
    assert collect_problems(load_config()) == []


def test_ppo_with_critic_and_ref_is_valid() -> None:
    cfg = load_config(
        None, ["algorithm.name=ppo", "critic.value_head=true", "algorithm.kl_coef=0.01", "ref.backend=fsdp"]
    )
    assert cfg.critic is not None and cfg.ref is not None


def test_all_problems_are_reported_in_one_error() -> None:
    overrides = ["train.batch_size=10", "rollout.sampling.top_p=0", "algorithm.name=ppo", "allocation=vllm:d1+fsdp:d1"]
    with pytest.raises(ConfigError) as info:
        load_config(None, overrides)
    message = str(info.value)
    assert message.startswith("invalid configuration (4 problems):")
    for field in ("train.batch_size:", "rollout.sampling.top_p:", "critic:", "rollout.backend:"):
        assert f"  - {field}" in message


def test_validate_config_rechecks_a_mutated_config() -> None:
    cfg = load_config()
    cfg.train.batch_size = 6
    object.__setattr__(cfg.actor.micro_batch, "n_mbs", 0)  # bypass __post_init__ as a buggy caller could
    with pytest.raises(ConfigError) as info:
        validate_config(cfg)
    assert "train.batch_size: must be a positive multiple" in str(info.value)
    assert "actor.micro_batch: n_mbs: must be an integer >= 1, got 0" in str(info.value)


def test_ref_optimizer_is_not_checked_because_ref_does_not_train() -> None:
    cfg = load_config(None, ["ref.optimizer.lr=0", "ref.lr_schedule.warmup_steps=500"])
    assert cfg.ref is not None and cfg.ref.optimizer.lr == 0.0


def test_group_algorithms() -> None:
    names = {
        name: uses_groups(load_config(None, [f"algorithm.name={name}", *extra]).algorithm)
        for name, extra in [
            ("grpo", []),
            ("dapo", []),
            ("rloo", []),
            ("gspo", []),
            ("ppo", ["critic.value_head=true"]),
            ("reinforce_plus_plus", ["ref.backend=fsdp"]),
        ]
    }
    assert names == {"grpo": True, "dapo": True, "rloo": True, "gspo": True, "ppo": False, "reinforce_plus_plus": False}


def test_validate_accepts_a_valid_config_built_in_code() -> None:
    cfg = dataclasses.replace(JobConfig(), train=dataclasses.replace(JobConfig().train, batch_size=8))
    validate_config(cfg)  # raises on failure


# ---- MicroBatchSpec validates itself (the engine builds it directly) -----------------------------


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"n_mbs": 0}, "n_mbs: must be an integer >= 1, got 0"),
        ({"granularity": 0}, "granularity: must be an integer >= 1"),
        ({"pad_to_multiple_of": -2}, "pad_to_multiple_of: must be an integer >= 1"),
        ({"max_tokens_per_mb": 0}, "max_tokens_per_mb: must be null or an integer >= 1"),
        ({"packing": "best"}, "packing: must be 'ffd' or 'kk'"),
        ({"memory_budget_gb": 0}, "memory_budget_gb: must be null or a number > 0"),
    ],
)
def test_micro_batch_spec_rejects(kwargs: dict, expected: str) -> None:
    with pytest.raises(ConfigError, match=expected):
        MicroBatchSpec(**kwargs)


def test_micro_batch_spec_reports_every_problem() -> None:
    with pytest.raises(ConfigError) as info:
        MicroBatchSpec(n_mbs=0, granularity=0)
    assert "n_mbs" in str(info.value) and "granularity" in str(info.value)
    assert MicroBatchSpec(n_mbs=2, max_tokens_per_mb=4096, packing="kk").problems() == []


def test_micro_batch_problem_from_yaml_names_section() -> None:
    with pytest.raises(ConfigError, match="critic.micro_batch: n_mbs: must be an integer >= 1, got 0"):
        load_config(None, ["algorithm.name=ppo", "critic.value_head=true", "critic.micro_batch.n_mbs=0"])


def test_a_fixed_sampling_seed_with_groups_is_refused() -> None:
    from areal_tasks.config import load_config
    from areal_tasks.errors import ConfigError

    with pytest.raises(ConfigError, match="samples of a group identical"):
        load_config("configs/demo_grpo.yaml", ["rollout.sampling.seed=3"])
    load_config("configs/demo_grpo.yaml", ["rollout.sampling.seed=3", "rollout.sampling.temperature=0"])


def test_colocation_with_disk_updates_and_on_cpu_is_valid() -> None:
    validate_config(load_config(None, ["allocation=embedded[rollout]:d1|fsdp[actor]:d1", "cluster.gpus_per_node=1"]))
    validate_config(
        load_config(None, ["allocation=embedded[rollout]:d1|fsdp[actor]:d1", "rollout.weight_update=collective"])
    )  # CPU: gloo between processes
    for cpu_or_gpu in (["cluster.gpus_per_node=1"], []):  # CUDA IPC on the shared GPU; a /dev/shm file on CPU
        validate_config(
            load_config(
                None, ["allocation=embedded[rollout]:d1|fsdp[actor]:d1", "rollout.weight_update=shared", *cpu_or_gpu]
            )
        )


def test_dims_the_built_backend_does_not_run_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from areal_tasks.engine import registry

    monkeypatch.setitem(registry._DIMS, "fsdp", "d")  # as if fsdp ran data parallel only
    with pytest.raises(ConfigError) as info:
        load_config(None, ["allocation=embedded:d1+fsdp:d1t2c2"])
    assert "allocation: training backend 'fsdp' does not run t2, c2 (component 'fsdp:t2c2'); it runs d (data)" in str(
        info.value
    )


def test_a_backend_the_allocation_names_but_not_the_actor_is_refused_on_both() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, ["allocation=embedded:d1+megatron:d2", "cluster.gpus_per_node=4"])
    message = str(info.value)
    assert "allocation: training backend 'megatron' (component 'megatron:d2') is not built" in message
    assert "actor.backend: must match the allocation's training backend 'megatron'" in message
