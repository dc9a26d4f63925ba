"""Shared weight updates on a GPU: a server process maps the trainer's buffer by CUDA IPC from its
JSON description alone, keeps the mapping, and sees every repack once ``pack`` has returned; the
copy into its own weights is exact (bf16 bytes in, bf16 bytes out)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from areal_tasks.weights.buckets import spec_of
from areal_tasks.weights.shared_buffer import SharedWeightBuffer, pick_buffer, shared_layout

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

# The server's side: open once, then for each line on stdin copy the tensors out of the buffer
# into "weights" of its own (as the embedded server's load does) and print their checksums.
SERVER = """
import json, sys, torch
from areal_tasks.weights.buckets import split_flat
from areal_tasks.weights.shared_buffer import open_shared_buffer, pick_buffer
descriptions, layout = json.loads(sys.argv[1]), json.loads(sys.argv[2])
device = torch.device("cuda", 0)
flat = open_shared_buffer(pick_buffer(descriptions, device))
names = [n for n, _, _ in layout]
types = [getattr(torch, d) for _, d, _ in layout]
shapes = [s for _, _, s in layout]
mine = {n: torch.empty(s, dtype=t, device=device) for n, t, s in zip(names, types, shapes)}
for _ in sys.stdin:
    views = split_flat(flat, names, types, shapes)
    torch._foreach_copy_([mine[n] for n in names], [views[n] for n in names])
    torch.cuda.synchronize()
    print(json.dumps({n: t.double().sum().item() for n, t in mine.items()}), flush=True)
"""


def test_a_server_process_maps_the_buffer_once_and_sees_every_repack() -> None:
    device = torch.device("cuda", 0)
    g = torch.Generator(device=device).manual_seed(0)
    named = {
        "model.embed_tokens.weight": torch.randn(1024, 256, generator=g, device=device),  # fp32 master -> bf16
        "model.norm.weight": torch.randn(256, generator=g, device=device),
    }
    layout = shared_layout([spec_of(n, t.to(torch.bfloat16)) for n, t in named.items()])
    buffer = SharedWeightBuffer(sum(s.nbytes for s in layout), device)
    wire = [[s.name, s.dtype, list(s.shape)] for s in layout]
    assert pick_buffer([buffer.describe()], device) == buffer.describe()
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER, json.dumps([buffer.describe()]), json.dumps(wire)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        for scale in (1.0, -3.0):  # the second pack goes into the same buffer the server mapped
            scaled = {n: t * scale for n, t in named.items()}
            buffer.pack(layout, scaled.items())
            assert server.stdin is not None and server.stdout is not None
            server.stdin.write("go\n")
            server.stdin.flush()
            seen = json.loads(server.stdout.readline())
            expected = {n: t.to(torch.bfloat16).double().sum().item() for n, t in scaled.items()}
            assert seen == pytest.approx(expected, rel=1e-6)
    finally:
        if server.stdin is not None:
            server.stdin.close()
        server.wait(timeout=60)
        buffer.close()
    assert server.returncode == 0


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_a_server_that_numbers_the_gpus_differently_picks_the_buffer_on_its_gpu_by_uuid() -> None:
    """Two trainer ranks' buffers (GPUs 0 and 1); a server started with ``CUDA_VISIBLE_DEVICES=1``
    calls its GPU cuda:0, and still reads the buffer of the rank on that GPU (matched by UUID)."""
    import os

    layout = shared_layout([spec_of("w", torch.empty(64, 64, dtype=torch.bfloat16))])
    wire = [[s.name, s.dtype, list(s.shape)] for s in layout]
    buffers = []
    try:
        for index, value in ((0, 1.0), (1, 2.0)):
            device = torch.device("cuda", index)
            buffer = SharedWeightBuffer(layout[0].nbytes, device)
            buffer.pack(layout, [("w", torch.full((64, 64), value, device=device))])
            buffers.append(buffer)
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": "1"}
        done = subprocess.run(
            [sys.executable, "-c", SERVER, json.dumps([b.describe() for b in buffers]), json.dumps(wire)],
            input="go\n",
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
            check=True,
        )
        assert json.loads(done.stdout) == {"w": 2.0 * 64 * 64}
    finally:
        for buffer in buffers:
            buffer.close()
