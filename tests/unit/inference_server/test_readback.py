"""``ReadbackBuffer``: a step of fewer rows than the buffer holds reads back into a contiguous view
(a strided pinned destination would make CUDA's copy wait for the device: the overlap lost), and
the buffer grows for a larger step."""

from __future__ import annotations

import torch

from areal_tasks.inference.server.readback import ReadbackBuffer


def test_fewer_rows_read_back_into_a_contiguous_view() -> None:
    readback = ReadbackBuffer(8, torch.device("cpu"))
    for rows in (3, 8, 12, 1):
        tokens = torch.arange(rows) + 100
        logprobs = -torch.arange(rows, dtype=torch.float32) / 4
        step = readback.start([], tokens, logprobs)
        assert step.host.is_contiguous() and step.host.shape == (2, rows)
        token_list, logprob_list = step.results()
        assert token_list == tokens.tolist() and all(type(t) is int for t in token_list)
        assert logprob_list == logprobs.tolist()
