"""A one-rank engine's process group leaves nothing on disk (issue #26: ``/tmp/areal_pg_*`` per engine).

Runs in a fresh interpreter so the default group of this test process (if another test started one)
is not touched, with ``TMPDIR`` pointed at an empty directory: after the group is built, used and
destroyed, that directory must still be empty.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

_SCRIPT = textwrap.dedent(
    """
    import os
    import torch
    import torch.distributed as dist
    from areal_tasks.engine.step_common import init_default_group

    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        os.environ.pop(key, None)
    for _ in range(2):
        init_default_group()
        value = torch.ones(3)
        dist.all_reduce(value)
        assert dist.get_world_size() == 1 and value.tolist() == [1.0, 1.0, 1.0]
        dist.destroy_process_group()
    print("ok")
    """
)


@pytest.mark.timeout(120)
def test_world_of_one_leaves_no_temp_dir(tmp_path: Path) -> None:
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    env.update(TMPDIR=str(scratch), CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-c", _SCRIPT], env=env, capture_output=True, text=True, timeout=110)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().endswith("ok")
    assert sorted(p.name for p in scratch.iterdir()) == []
