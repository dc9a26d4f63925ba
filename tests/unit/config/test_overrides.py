"""Dotted overrides: every supported field type, type errors, unknown keys, null/optional sections."""

from __future__ import annotations

import pytest

from areal_tasks.config import EngineConfig, load_config
from areal_tasks.config.overrides import parse_override
from areal_tasks.errors import ConfigError


def value_at(cfg: object, dotted: str) -> object:
    for key in dotted.split("."):
        cfg = getattr(cfg, key)
    return cfg


@pytest.mark.parametrize(
    ("override", "path", "expected"),
    [
        ("train.total_steps=7", "train.total_steps", 7),  # int
        ("actor.optimizer.lr=1e-5", "actor.optimizer.lr", 1e-5),  # float, exponent without a dot
        ("actor.optimizer.grad_clip=2", "actor.optimizer.grad_clip", 2.0),  # int accepted for float
        ("dataset.shuffle=false", "dataset.shuffle", False),  # bool
        ("experiment.name=exp1", "experiment.name", "exp1"),  # str
        ("experiment.trial=007", "experiment.trial", "007"),  # a str field takes the text as written
        ("experiment.name=[x]", "experiment.name", "[x]"),
        ("experiment.name='true'", "experiment.name", "true"),  # quoted text parses as YAML
        ("tracking.mlflow_uri=null", "tracking.mlflow_uri", None),  # null still means None for str | None
        ("experiment.name=no", "experiment.name", "no"),  # YAML 1.2: 'no' is a string
        ("actor.lr_schedule.type=cosine", "actor.lr_schedule.type", "cosine"),  # Literal
        ("evaluation.max_eval_prompts=5", "evaluation.max_eval_prompts", 5),  # int | None
        ("rollout.sampling.seed=null", "rollout.sampling.seed", None),
        ("rollout.sampling.stop=[</s>, '###']", "rollout.sampling.stop", ["</s>", "###"]),  # list[str]
        ("rollout.sampling.stop_token_ids=[1, 2]", "rollout.sampling.stop_token_ids", [1, 2]),  # list[int]
        ("actor.lora.target_modules=[q_proj]", "actor.lora.target_modules", ["q_proj"]),  # list[str] | None
        ("storage.options={anon: true, n: 1}", "storage.options", {"anon": True, "n": 1}),  # dict[str, Any]
        ("storage.options.endpoint_url=http://x:9000", "storage.options", {"endpoint_url": "http://x:9000"}),
        ("actor.optimizer={lr: 2e-6, eps: 1e-7}", "actor.optimizer.eps", 1e-7),  # nested dataclass mapping
    ],
)
def test_each_supported_type(override: str, path: str, expected: object) -> None:
    cfg = load_config(None, [override])
    value = value_at(cfg, path)
    assert value == expected
    assert type(value) is type(expected)


def test_mapping_override_merges_into_section() -> None:
    cfg = load_config(None, ["actor.optimizer.weight_decay=0.5", "actor.optimizer={lr: 2e-6}"])
    assert (cfg.actor.optimizer.lr, cfg.actor.optimizer.weight_decay) == (2e-6, 0.5)


def test_setting_a_key_under_a_null_section_creates_it_from_defaults() -> None:
    assert load_config().ref is None
    cfg = load_config(None, ["ref.optimizer.lr=3e-6"])
    assert isinstance(cfg.ref, EngineConfig)
    assert cfg.ref.optimizer.lr == 3e-6
    assert cfg.ref.micro_batch == EngineConfig().micro_batch


def test_null_disables_a_section_and_order_matters() -> None:
    assert load_config(None, ["ref.backend=fsdp", "ref=null"]).ref is None
    assert load_config(None, ["ref=null", "ref.backend=fsdp"]).ref is not None


@pytest.mark.parametrize(
    ("override", "expected_fragment"),
    [
        ("train.total_steps=1.5", "train.total_steps: expected int, got 1.5 (float)"),
        ("train.total_steps=true", "train.total_steps: expected int, got True (bool)"),
        ("actor.optimizer.lr=fast", "actor.optimizer.lr: expected float, got 'fast' (str)"),
        ("dataset.shuffle=1", "dataset.shuffle: expected bool, got 1 (int)"),
        ("cluster.scheduler=lokal", "cluster.scheduler: expected one of 'local', 'ray', 'slurm', 'skypilot'"),
        ("rollout.staleness_bound=strict", "rollout.staleness_bound: expected one of 'sample', 'admission'"),
        ("rollout.sampling.seed=x", "rollout.sampling.seed: expected int | null, got 'x'"),
        ("rollout.sampling.stop_token_ids=[1, a]", "rollout.sampling.stop_token_ids[1]: expected int, got 'a'"),
        ("rollout.sampling.stop=a", "rollout.sampling.stop: expected list[str], got 'a'"),
        ("storage.options=[1]", "storage.options: expected dict[str, any value], got [1]"),
        ("actor=3", "actor: expected a mapping (EngineConfig), got 3"),
        ("actor=null", "actor: expected a mapping (EngineConfig), got null"),
        ("train.batch_size=null", "train.batch_size: expected int, got null"),
    ],
)
def test_type_errors_name_field_and_expected_type(override: str, expected_fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, [override])
    message = str(info.value)
    assert expected_fragment in message
    assert f"set in override {override!r}" in message


def test_all_type_errors_are_reported_together() -> None:
    with pytest.raises(ConfigError, match=r"\(3 problems\)") as info:
        load_config(None, ["train.total_steps=x", "dataset.shuffle=2", "model.dtype=fp8"])
    for field in ("train.total_steps", "dataset.shuffle", "model.dtype"):
        assert field in str(info.value)


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("actor.optimiser.lr=1e-6", "actor.optimiser: unknown key; did you mean actor.optimizer?"),
        ("trian.batch_size=8", "trian: unknown key; did you mean train?"),
        ("rollout.sampling.temprature=0.5", "did you mean rollout.sampling.temperature?"),
        ("ref.optimzer.lr=1", "did you mean ref.optimizer?"),  # checked even under a null section
        ("algorithm.eps_clip_hi=0.3", "did you mean algorithm.eps_clip_high?"),
    ],
)
def test_unknown_key_suggests_closest(override: str, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, [override])
    assert expected in str(info.value)
    assert "Valid keys at" in str(info.value)


def test_unknown_key_lists_valid_keys_at_that_level() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, ["actor.optimizer.zzz=1"])
    message = str(info.value)
    assert "actor.optimizer.zzz: unknown key." in message
    assert "Valid keys at actor.optimizer: type, lr, weight_decay, beta1, beta2, eps, grad_clip" in message


def test_keys_under_a_scalar_are_rejected() -> None:
    with pytest.raises(ConfigError, match="model.path is str, it has no keys"):
        load_config(None, ["model.path.x=1"])


def test_override_problems_are_collected() -> None:
    with pytest.raises(ConfigError, match=r"\(2 problems\)"):
        load_config(None, ["foo=1", "actor.bar=2"])


@pytest.mark.parametrize("text", ["noequals", "=1", "a..b=1", ".a=1", "a b=1"])
def test_malformed_override(text: str) -> None:
    with pytest.raises(ConfigError, match="expected KEY=VALUE"):
        parse_override(text)


def test_override_value_with_equals_sign_and_empty_value() -> None:
    parsed = parse_override("storage.url=s3://b/p?x=1")
    assert (parsed.keys, parsed.value) == (("storage", "url"), "s3://b/p?x=1")
    assert parse_override("experiment.run_dir=").value is None


def test_invalid_yaml_value() -> None:
    with pytest.raises(ConfigError, match="not valid YAML"):
        parse_override("rollout.sampling.stop=[a")
