"""Fixtures of the checkpoint unit tests: a toy engine (plain module + AdamW + LambdaLR, one process)
with a frozen embedding, and managers over file:// and memory:// storage."""

from __future__ import annotations

import random
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from areal_tasks.checkpoint.manager import CheckpointManager
from areal_tasks.config.sections import SaverConfig


class ToyEngine:
    """The engine surface a checkpoint uses: ``model``, ``optimizer``, ``lr_scheduler``, version."""

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


def _make_manager(url: str, incremental: bool = True, **saver: Any) -> CheckpointManager:
    return CheckpointManager(url, None, "exp", "trial", SaverConfig(**saver), incremental=incremental)


@pytest.fixture
def toy_engine() -> type[ToyEngine]:
    """The ToyEngine class: ``toy_engine(seed=0)``."""
    return ToyEngine


@pytest.fixture
def make_manager() -> Any:
    """``make_manager(url, incremental=True, **saver_config_fields) -> CheckpointManager``."""
    return _make_manager


@pytest.fixture(params=["file", "memory"])
def storage_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "file":
        return f"file://{tmp_path}/store"
    return f"memory://ckpt-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def file_url(tmp_path: Path) -> str:
    return f"file://{tmp_path}/store"
