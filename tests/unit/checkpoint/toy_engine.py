"""A toy engine for checkpoint tests in one process: the checkpointable role
(``api/train_engine.py: CheckpointableEngine``: sharded state, engine facts, HF sidecar) over a plain
module with a frozen embedding, whose training steps draw from the global torch, NumPy and Python
RNGs. The role comes from the mixin any one-process torch-module engine may use
(``engine/module_state.py: ModuleCheckpointing``); the module has no HF config, so the sidecar is
empty."""

from __future__ import annotations

import random

import numpy as np
import torch

from areal_tasks.engine.module_state import ModuleCheckpointing


class ToyEngine(ModuleCheckpointing):
    """A toy model (no HF config: an empty sidecar) whose steps draw from the global RNGs."""

    role = "actor"

    def __init__(self, seed: int = 0, vocab: int = 64, hidden: int = 32) -> None:
        torch.manual_seed(seed)
        np.random.seed(seed)
        random.seed(seed)
        self.model = torch.nn.Sequential(torch.nn.Embedding(vocab, hidden), torch.nn.Linear(hidden, vocab))
        self.model[0].weight.requires_grad_(False)  # frozen: incremental saves reference it
        trainable = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(trainable, lr=1e-2)
        self.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda s: 1.0 / (s + 1))
        self._version = 0
        self.vocab = vocab

    def get_version(self) -> int:
        return self._version

    def set_version(self, version: int) -> None:
        self._version = version

    def train_step(self) -> float:
        """One step whose data comes from the global torch, numpy and Python RNGs."""
        tokens = torch.randint(0, self.vocab, (16,))
        noise = float(np.random.rand()) + random.random()
        loss = self.model(tokens).logsumexp(-1).mean() * (1.0 + 0.01 * noise)
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.lr_scheduler.step()
        self._version += 1
        return float(loss.detach())

    def params(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().clone() for k, v in self.model.state_dict().items()}
