"""A second, minimal train engine: one process, a plain HF causal LM, AdamW, no FSDP and no mesh.

It implements :class:`~areal_tasks.api.train_engine.TrainEngine` with nothing from ``engine/fsdp/``:
the per-token log-probs come from the shared kernels (``areal_tasks.kernels.logprobs``), the
checkpointable role from the torch-module helpers (``engine/module_state.py``), the HF save from the
model-generic writer (``models/hf_dir.py``). A test registers it in ``engine/registry.py`` and drives
the trainer's own code with it (engine building, the RL step, checkpoints), which shows that those
seams need no FSDP. Each sequence runs through the model on its own (no packed attention), and a
batch is one micro-batch.
"""

from __future__ import annotations

import itertools
import logging
import math
from typing import Any

import torch

from areal_tasks.api.batch import CU_SEQLENS, INPUT_IDS
from areal_tasks.api.train_engine import (
    Batch,
    LossFn,
    LossWeightFn,
    ParallelInfo,
    SaveFormat,
    TrainEngine,
    TrainStats,
)
from areal_tasks.config.engine import EngineConfig
from areal_tasks.engine.module_state import ModuleCheckpointing
from areal_tasks.engine.parallel.mesh import ParallelDims
from areal_tasks.errors import EngineError
from areal_tasks.kernels.logprobs import align_to_tokens, next_token_labels, next_token_stats

logger = logging.getLogger(__name__)

#: the registry name the tests give it.
BACKEND = "minimal"


class MinimalEngine(ModuleCheckpointing, TrainEngine):
    """One process, data parallel of one; ``trainable=False`` builds no optimizer (a reference)."""

    def __init__(
        self,
        config: EngineConfig,
        model_path: str,
        *,
        parallel: ParallelDims | None = None,
        total_steps: int = 1,
        trainable: bool = True,
        temperature: float = 1.0,
        seed: int = 1,
    ) -> None:
        if parallel is not None and parallel.world_size != 1:
            raise EngineError(f"the minimal engine runs on one process, not {parallel}")
        if config.value_head:
            raise EngineError("the minimal engine has no value head (it trains actors and references)")
        if config.lr_schedule.type != "constant":
            raise EngineError(f"the minimal engine keeps a constant LR, not {config.lr_schedule.type!r}")
        self.config, self.model_path = config, model_path
        self.total_steps, self.trainable = total_steps, trainable
        self.temperature, self.seed = temperature, seed
        self.role = "actor"
        self._version = 0
        self.model: Any = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.lr_scheduler: Any = None

    # lifecycle
    def initialize(self) -> None:
        from transformers import AutoModelForCausalLM

        torch.manual_seed(self.seed)
        self.model = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=torch.float32)
        if self.trainable:
            opt = self.config.optimizer
            self.optimizer = torch.optim.AdamW(
                self.model.parameters(),
                lr=opt.lr,
                betas=(opt.beta1, opt.beta2),
                eps=opt.eps,
                weight_decay=opt.weight_decay,
            )
            self.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda _: 1.0)
        else:
            self.model.requires_grad_(False)

    def destroy(self) -> None:
        self.model = self.optimizer = self.lr_scheduler = None

    def get_version(self) -> int:
        return self._version

    def set_version(self, version: int) -> None:
        self._version = int(version)

    # forward
    @property
    def parallel(self) -> ParallelInfo:
        return ParallelInfo(world_size=1, rank=0, dp_size=1, dp_rank=0)

    def _outputs(self, batch: Batch, *, with_entropy: bool) -> dict[str, torch.Tensor]:
        ids, cu = batch[INPUT_IDS], batch[CU_SEQLENS]
        logits = torch.cat(
            [self.model(input_ids=ids[lo:hi][None]).logits[0] for lo, hi in itertools.pairwise(cu.tolist())]
        )
        logprobs, entropy = next_token_stats(
            logits, next_token_labels(ids), temperature=self.temperature, with_entropy=with_entropy
        )
        out = {"logprobs": align_to_tokens(logprobs, cu)}
        if entropy is not None:
            out["entropy"] = align_to_tokens(entropy, cu)
        return out

    def forward_batch(self, batch: Batch, *, with_entropy: bool = False) -> dict[str, torch.Tensor]:
        self.model.eval()
        with torch.no_grad():
            return self._outputs(batch, with_entropy=with_entropy)

    # training
    def _weighted(self, batch: Batch, loss_fn: LossFn, loss_weight_fn: LossWeightFn) -> tuple[Any, dict]:
        weight = float(loss_weight_fn(batch))
        if weight <= 0 or not math.isfinite(weight):
            raise EngineError(f"the batch's loss weight is {weight}: nothing to train on")
        loss, stats = loss_fn(self._outputs(batch, with_entropy=True), batch)
        values = {"loss": loss, **stats}
        out = {k: float(v.detach()) if isinstance(v, torch.Tensor) else float(v) for k, v in values.items()}
        return loss, {**out, "n_tokens": float(len(batch[INPUT_IDS]))}

    def train_batch(self, batch: Batch, loss_fn: LossFn, loss_weight_fn: LossWeightFn) -> TrainStats:
        if self.optimizer is None:
            raise EngineError("this engine was built forward-only (trainable=False)")
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        loss, stats = self._weighted(batch, loss_fn, loss_weight_fn)
        loss.backward()
        clip = self.config.optimizer.grad_clip
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip if clip > 0 else float("inf"))
        stats["lr"] = float(self.optimizer.param_groups[0]["lr"])
        stats["grad_norm"] = float(norm)
        if math.isfinite(stats["grad_norm"]):
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return stats

    def eval_batch(self, batch: Batch, loss_fn: LossFn, loss_weight_fn: LossWeightFn) -> TrainStats:
        self.model.eval()
        with torch.no_grad():
            return self._weighted(batch, loss_fn, loss_weight_fn)[1]

    def step_lr_scheduler(self) -> float:
        if self.lr_scheduler is None:
            raise EngineError("this engine was built forward-only (trainable=False)")
        self.lr_scheduler.step()
        return float(self.lr_scheduler.get_last_lr()[0])

    # HF save / load (a checkpoint goes through the checkpointable role of ModuleCheckpointing)
    def save(self, path: str, format: SaveFormat = "hf", *, with_optimizer: bool = True) -> None:
        from areal_tasks.models.hf_dir import write_hf_dir

        if format != "hf":
            raise EngineError(f"the minimal engine saves 'hf' only (checkpoints: checkpoint/), not {format!r}")
        tensors = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        if self.model.config.tie_word_embeddings:
            tensors.pop("lm_head.weight", None)
        write_hf_dir(path, tensors, self.model.config, source_dir=self.model_path, on_exists="replace_owned")

    def load(self, path: str, format: SaveFormat = "dcp", *, with_optimizer: bool = True) -> None:
        from areal_tasks.models.safetensors_dir import read_safetensors_dir

        if format != "hf":
            raise EngineError(f"the minimal engine loads 'hf' only, not {format!r}")
        self.model.load_state_dict(read_safetensors_dir(path), strict=False)
