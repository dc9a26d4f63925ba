"""Options do not change the maths: gradient checkpointing and CPU offload (each with dp=2, and
checkpointing under Ulysses sp=2, where the recomputation replays the all-to-alls), and whole
decoder blocks through ``torch.compile`` under per-block FSDP2 units with checkpointing (the
recomputation reruns the compiled forward), match the single-process reference in loss and
gradients (fp32, 1e-5)."""

from __future__ import annotations

import pytest
import torch
from engine_helpers import ATOL, make_batch, max_abs_diff, reference_grads
from launch import run_workers

pytestmark = pytest.mark.distributed


@pytest.mark.parametrize(
    "layout, options",
    [
        ({}, {"gradient_checkpointing": True, "cpu_offload": True}),
        ({"sp": 2}, {"gradient_checkpointing": True}),
        # per-block FSDP2 units (dp=2 on CPU) around compiled whole blocks: the hooks stay eager
        ({}, {"compile": "on", "compile_scope": "blocks", "gradient_checkpointing": True}),
    ],
    ids=["dp2-ckpt-offload", "sp2-ckpt", "dp2-compiled-blocks-ckpt"],
)
def test_options_keep_reference_gradients(layout, options, tiny_qwen2, tmp_path):
    args = {"model_dirs": {"qwen2": str(tiny_qwen2)}, "options": options, **layout}
    run_workers("workers_fsdp:family_grads", 2, tmp_path, args)
    result = torch.load(tmp_path / "qwen2.pt", weights_only=False)
    loss, grads, _ = reference_grads(tiny_qwen2, make_batch(seed=0))
    assert result["stats"]["loss"] == pytest.approx(loss, abs=ATOL)
    diff, name = max_abs_diff(result["grads"], grads)
    assert diff < ATOL, f"gradient of {name} differs by {diff}"
