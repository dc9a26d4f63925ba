"""The flat-gradient kernel's block tables (CPU): every element of every parameter is covered by
exactly one program, at the right offset of the flat buffer; and what the kernel cannot take is
refused by name before anything runs. The kernel itself is checked against the torch-op path on a
GPU (``tests/gpu/test_flat_params_gpu.py``)."""

from __future__ import annotations

import pytest
import torch

from areal_tasks.engine.fsdp.flat_grad_kernels import BLOCK, BlockTable, accumulate_into
from areal_tasks.errors import EngineError


@pytest.mark.parametrize("sizes", [[1], [BLOCK], [BLOCK + 1, 3, 0, 2 * BLOCK - 1], [5, 7, BLOCK * 3]])
def test_block_table_covers_every_element_once(sizes: list[int]) -> None:
    table = BlockTable(sizes, torch.device("cpu"))
    assert table.params == len(sizes) and table.total == sum(sizes)
    covered = torch.zeros(sum(sizes), dtype=torch.int64)
    for param, start in zip(table.block_param.tolist(), table.block_start.tolist()):
        numel, offset = int(table.param_numel[param]), int(table.param_offset[param])
        assert 0 <= start < numel and start % BLOCK == 0
        covered[offset + start : offset + min(start + BLOCK, numel)] += 1
    assert bool((covered == 1).all())
    assert table.param_offset.tolist() == [sum(sizes[:i]) for i in range(len(sizes))]


def test_bad_tables_and_buffers_are_refused() -> None:
    with pytest.raises(EngineError, match="sizes >= 0"):
        BlockTable([], torch.device("cpu"))
    with pytest.raises(EngineError, match="sizes >= 0"):
        BlockTable([3, -1], torch.device("cpu"))
    table = BlockTable([2, 3], torch.device("cpu"))
    like = torch.zeros(5, dtype=torch.bfloat16)
    with pytest.raises(EngineError, match="contiguous CUDA fp32 buffer of 5 elements"):
        accumulate_into(torch.zeros(5), [None, None], table, like, fresh=True)
