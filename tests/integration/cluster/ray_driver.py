"""Ray driver programs the Ray integration tests run inside node 0 (a Ray node: drivers may only run there).

gloo OUT             2 ranks with placement [0, 1] all-reduce over gloo across the nodes; writes OUT (JSON)
orphan OUT           a worker with a grandchild; ray.kill its supervisor; OUT says whether the grandchild died
node-loss READY OUT  a worker on node 1; touch READY; wait for check() to raise; write its message to OUT
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import ray

from areal_tasks.api.scheduler import ReadinessCheck, WorkerGroupSpec, WorkerStatus
from areal_tasks.errors import WorkerFailedError
from areal_tasks.launch.process import pid_alive
from areal_tasks.launch.ray.scheduler import RayScheduler

WORKER = str(Path(__file__).resolve().parents[2] / "unit" / "launch" / "worker.py")

GLOO = """
import json, os, sys, torch, torch.distributed as dist
from areal_tasks.launch.netif import pin_socket_interface
pin_socket_interface()
dist.init_process_group("gloo", timeout=__import__("datetime").timedelta(seconds=60))
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
keys = ("MASTER_ADDR", "RANK", "LOCAL_RANK", "NODE_RANK", "AREAL_NODE_ADDR", "GLOO_SOCKET_IFNAME")
json.dump({"sum": t.item(), **{k: os.environ.get(k) for k in keys}}, open(sys.argv[1], "w"))
dist.destroy_process_group()
"""


def gloo(out: Path) -> int:
    with RayScheduler(out.parent / "run", nodes=2, handle_signals=False) as sched:
        spec = WorkerGroupSpec(
            name="gloo",
            command=[sys.executable, "-c", GLOO, str(out.parent / "rank-{rank}.json")],
            replicas=2,
            ports_per_worker=0,
            torch_distributed=True,
            placement=[0, 1],
        )
        sched.start_group(spec)
        finals = sched.wait("gloo", timeout_s=120)
        sched.check("gloo")
        ranks = [json.loads((out.parent / f"rank-{r}.json").read_text()) for r in range(2)]
        nodes = [n.address for n in sched.nodes()]
        out.write_text(json.dumps({"nodes": nodes, "ranks": ranks, "status": [f.status.value for f in finals]}))
    return 0


def orphan(out: Path) -> int:
    with RayScheduler(out.parent / "run", nodes=2, handle_signals=False) as sched:
        ready, pidfile = out.parent / "ready", out.parent / "grandchild.pid"
        spec = WorkerGroupSpec(
            name="orphan",
            command=[sys.executable, WORKER, "escaped-child", str(ready), str(pidfile)],
            readiness=ReadinessCheck.file(str(ready)),
        )
        sched.start_group(spec)
        sched.wait_ready("orphan", timeout_s=60)
        grandchild = int(pidfile.read_text())
        alive_before = pid_alive(grandchild)
        actor = sched._groups["orphan"].workers[0].actor  # the test reaches in: kill the supervisor only
        ray.kill(actor, no_restart=True)
        deadline = time.monotonic() + 15
        while pid_alive(grandchild) and time.monotonic() < deadline:
            time.sleep(0.1)
        out.write_text(json.dumps({"before": alive_before, "after": pid_alive(grandchild)}))
    return 0


def node_loss(ready: Path, out: Path) -> int:
    sched = RayScheduler(out.parent / "run", nodes=2, handle_signals=False, unavailable_grace_s=5.0)
    spec = WorkerGroupSpec(name="far", command=[sys.executable, WORKER, "sleep"], placement=[1])
    sched.start_group(spec)
    ready.touch()
    deadline = time.monotonic() + 90
    message = "no WorkerFailedError within 90 s"
    while time.monotonic() < deadline:
        try:
            sched.check("far")
        except WorkerFailedError as exc:
            message = str(exc)
            break
        time.sleep(0.5)
    status = sched.status("far")[0].status
    out.write_text(json.dumps({"message": message, "failed": status is WorkerStatus.FAILED}))
    sched.stop_all(grace_s=1.0)
    return 0


if __name__ == "__main__":
    mode, args = sys.argv[1], [Path(a) for a in sys.argv[2:]]
    sys.exit({"gloo": gloo, "orphan": orphan, "node-loss": node_loss}[mode](*args))
