"""The seams need no FSDP: a second engine (``minimal_engine.py``: one process, a plain HF model,
AdamW), registered in the engine registry, is built by the trainer's own ``build_engines``, runs one
GRPO step through ``RLStep`` (proximal log-probs, group advantages, the decoupled PPO loss), and is
checkpointed, resumed and exported to HF through ``checkpoint/``."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from areal_tasks.algo import build_algorithm, keys
from areal_tasks.api.train_engine import CheckpointableEngine, ForwardEngine, TrainableEngine, TrainEngine
from areal_tasks.api.workflow import Trajectory
from areal_tasks.checkpoint.manager import CheckpointManager
from areal_tasks.checkpoint.state import TrainerState
from areal_tasks.config import load_config
from areal_tasks.config.sections import SaverConfig
from areal_tasks.engine.registry import register_engine, unregister_engine
from areal_tasks.trainer.engines import build_engines, engine_layout
from areal_tasks.trainer.rl_batch import pack_trajectories
from areal_tasks.trainer.rl_step import RLStep
from tests.unit.engine.minimal_engine import BACKEND, MinimalEngine

GROUP = 4


@pytest.fixture
def registered():
    register_engine(BACKEND, MinimalEngine, dims="d")
    yield
    unregister_engine(BACKEND)


def _job(tmp_path, **actor):
    cfg = load_config(
        None,
        [
            f"experiment.run_dir={tmp_path}",
            "algorithm.name=grpo",
            f"rollout.group_size={GROUP}",
            f"train.batch_size={2 * GROUP}",
            "actor.optimizer.lr=1e-3",
        ],
    )
    return dataclasses.replace(cfg, actor=dataclasses.replace(cfg.actor, backend=BACKEND, **actor))


def _batch(vocab: int, version: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(7)
    trajs = []
    for i in range(2 * GROUP):
        prompt = torch.randint(3, vocab, (4,), generator=gen).tolist()
        output = torch.randint(3, vocab, (2 + i % 3,), generator=gen).tolist()
        trajs.append(
            Trajectory(
                input_ids=prompt + output,
                loss_mask=[0] * len(prompt) + [1] * len(output),
                logprobs=[0.0] * len(prompt) + [-2.0] * len(output),
                versions=[-1] * len(prompt) + [version] * len(output),
                reward=float(i % 2),
                prompt_len=len(prompt),
            )
        )
    return pack_trajectories(trajs, GROUP, version)


def _params(engine: MinimalEngine) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in engine.model.state_dict().items()}


def test_minimal_engine_runs_an_rl_step_and_a_checkpoint(registered, tmp_path, tiny_qwen2):
    cfg = _job(tmp_path)
    engines = build_engines(cfg, str(tiny_qwen2), n_steps=2)  # the trainer's own builder, by backend name
    actor = engines["actor"]
    assert set(engines) == {"actor"} and isinstance(actor, MinimalEngine)
    for role in (TrainEngine, TrainableEngine, ForwardEngine, CheckpointableEngine):
        assert isinstance(actor, role)
    assert engine_layout(engines) == {"actor": {"world_size": 1, "dp": 1, "tp": 1, "sp": 1}}

    before = _params(actor)
    step = RLStep(actor, build_algorithm(cfg.algorithm), GROUP)
    stats = step.run(_batch(actor.model.config.vocab_size))
    assert stats["actor/grad_norm"] > 0 and torch.isfinite(torch.tensor(stats["actor/loss"]))
    assert stats["actor/lr"] == pytest.approx(1e-3) and stats["advantage/abs_mean"] > 0
    trained = _params(actor)
    assert any(not torch.equal(before[k], trained[k]) for k in before), "the RL step changed no weight"
    actor.set_version(1)

    manager = CheckpointManager(f"file://{tmp_path}/store", None, "exp", "trial", SaverConfig())
    manager.save(1, engines, TrainerState(step=1, version=1), {"reward/mean": stats["reward/mean"]}).wait()
    fresh = build_engines(cfg, str(tiny_qwen2), n_steps=2)
    assert manager.recover("auto", fresh).step == 1
    restored = fresh["actor"]
    assert restored.get_version() == 1
    assert all(torch.equal(trained[k], v) for k, v in _params(restored).items())
    moments = [s["exp_avg"] for s in restored.optimizer.state.values()]
    assert moments and any(m.abs().sum() > 0 for m in moments), "the optimizer state was not restored"

    # the checkpoint exports to HF with the trained weights, from the engine's sidecar files
    from transformers import AutoModelForCausalLM

    from areal_tasks.checkpoint.export import export_hf

    export_hf(manager.layout.storage, 1, tmp_path / "hf")
    exported = AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"), dtype=torch.float32).state_dict()
    assert all(torch.equal(exported[k], trained[k]) for k in exported)
    manager.close()


def test_minimal_engine_refuses_what_it_cannot_run(tiny_qwen2):
    from areal_tasks.config.engine import EngineConfig
    from areal_tasks.engine.parallel.mesh import ParallelDims
    from areal_tasks.errors import EngineError

    with pytest.raises(EngineError, match="one process"):
        MinimalEngine(EngineConfig(), str(tiny_qwen2), parallel=ParallelDims(dp=2))
    ref = MinimalEngine(EngineConfig(), str(tiny_qwen2), trainable=False)
    ref.initialize()
    batch = _batch(ref.model.config.vocab_size)
    out = ref.forward_batch(batch)
    assert out[keys.LOGPROBS].shape == batch[keys.LOSS_MASK].shape
    with pytest.raises(EngineError, match="forward-only"):
        ref.step_lr_scheduler()
