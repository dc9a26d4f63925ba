"""RNG capture/restore: Python, NumPy and torch continue exactly where they were; the state is JSON."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from areal_tasks.checkpoint.rng import capture_rng_state, restore_rng_state
from areal_tasks.errors import CheckpointError


def _draw() -> tuple:
    return random.random(), float(np.random.rand()), float(np.random.randn()), torch.rand(3).tolist()


def test_restore_continues_every_generator():
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    np.random.randn()  # leaves a cached Gaussian in numpy's state
    state = json.loads(json.dumps(capture_rng_state()))
    expected = [_draw() for _ in range(3)]
    random.seed(9)
    np.random.seed(9)
    torch.manual_seed(9)
    restore_rng_state(state)
    assert [_draw() for _ in range(3)] == expected


def test_malformed_states_are_refused():
    with pytest.raises(CheckpointError, match="format"):
        restore_rng_state({"format": 0})
    state = capture_rng_state()
    del state["numpy"]
    with pytest.raises(CheckpointError, match="malformed"):
        restore_rng_state(state)
