"""One SLURM allocation as the scheduler sees it: its job id, its nodes, its state, and its steps.

Either an existing allocation (the batch job's, ``$SLURM_JOB_ID``) or one taken on first use with
``salloc --no-shell --nodes=N [--exclusive]`` and cancelled by :meth:`Allocation.release`. The
nodes come from ``scontrol show job`` (``NodeList``), ``scontrol show hostnames`` and ``scontrol
show node`` (``NodeAddr``, ``CPUTot``, ``Gres``). Its state is looked up every few seconds while
workers run, so that steps whose node was lost (their ``srun`` clients may never notice) are seen
to end with the allocation (``NODE_FAIL``). Steps are listed with ``squeue -s`` and signalled with
``scancel ID.STEP`` (which exits 225 after delivering a signal, a SLURM 22.05 quirk, ignored).
"""

from __future__ import annotations

import logging
import re
import subprocess
import threading
import time

from areal_tasks.api.scheduler import NodeInfo
from areal_tasks.config.cluster import SlurmConfig
from areal_tasks.errors import SchedulerError
from areal_tasks.launch.slurm.commands import parse_key_values, parse_rows, run_slurm

logger = logging.getLogger(__name__)

__all__ = ["Allocation"]

#: scancel's exit code when it signals a step (the signal is delivered; SLURM 22.05 says "Invalid job id").
SCANCEL_STEP_QUIRK = 225
#: seconds between two looks at the allocation's state (``scontrol show job``).
POLL_S = 2.0
#: allocation states in which its steps can still run.
LIVE_STATES = ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED")
_GRES_GPU = re.compile(r"gpu(?::[^:(,]+)?:(\d+)")


class Allocation:
    """The allocation ``job_id`` (None: take one with ``salloc`` on first use; see the module docstring)."""

    def __init__(
        self,
        slurm_conf: str,
        slurm: SlurmConfig,
        *,
        job_id: str | None,
        nodes: int,
        gpus_per_node: int,
        name: str,
        timeout_s: float,
    ) -> None:
        self.slurm_conf = slurm_conf
        self.slurm = slurm
        self.n_nodes = nodes
        self.gpus_per_node = gpus_per_node
        self.name = name
        self.timeout_s = timeout_s
        self._job_id = job_id or None
        self.own = False
        self._nodes: list[NodeInfo] | None = None
        self._seen: tuple[float, str] = (0.0, "")
        self._lock = threading.RLock()

    def run(self, argv: list[str], timeout: float = 30.0, check: bool = True) -> subprocess.CompletedProcess[str]:
        return run_slurm(argv, timeout, slurm_conf=self.slurm_conf, check=check)

    @property
    def known_id(self) -> str | None:
        """The job id if there is an allocation now (never takes one)."""
        return self._job_id

    @property
    def job_id(self) -> str:
        """The allocation's job id (taken with ``salloc`` on first use when there is none)."""
        with self._lock:
            if self._job_id is None:
                self._job_id = self._allocate()
                self.own = True
            return self._job_id

    def _allocate(self) -> str:
        s = self.slurm
        argv = [
            "salloc",
            "--no-shell",
            f"--nodes={self.n_nodes}",
            f"--job-name={self.name}-alloc",
            f"--immediate={max(1, int(self.timeout_s))}",
        ]
        if s.exclusive:
            argv.append("--exclusive")
        if self.gpus_per_node > 0:
            argv.append(f"--gres=gpu:{self.gpus_per_node}")
        for option, value in (("partition", s.partition), ("account", s.account), ("qos", s.qos)):
            if value:
                argv.append(f"--{option}={value}")
        if s.time_limit:
            argv.append(f"--time={s.time_limit}")
        done = self.run(argv, timeout=self.timeout_s + 30.0)
        match = re.search(r"Granted job allocation (\d+)", done.stderr + done.stdout)
        if match is None:
            raise SchedulerError(
                f"salloc did not grant an allocation of {self.n_nodes} node(s): {done.stderr.strip() or done.stdout}"
            )
        logger.info("took SLURM allocation %s (%d node(s))", match.group(1), self.n_nodes)
        return match.group(1)

    def nodes(self) -> list[NodeInfo]:
        """The allocation's nodes in SLURM's order: name, ``NodeAddr``, ``CPUTot`` and the GPUs asked for."""
        with self._lock:
            if self._nodes is None:
                self._nodes = self._read_nodes(self.job_id)
            return list(self._nodes)

    def _read_nodes(self, job_id: str) -> list[NodeInfo]:
        job = parse_key_values(self.run(["scontrol", "show", "job", job_id, "-o"]).stdout.strip())
        nodelist = job.get("NodeList", "")
        if not nodelist or nodelist == "(null)":
            raise SchedulerError(
                f"SLURM job {job_id} has no nodes (JobState={job.get('JobState')}, Reason={job.get('Reason')}); "
                "is the allocation still running?"
            )
        names = self.run(["scontrol", "show", "hostnames", nodelist]).stdout.split()
        out = []
        for index, name in enumerate(names):
            node = parse_key_values(self.run(["scontrol", "show", "node", name, "-o"]).stdout.strip())
            gres = sum(int(n) for n in _GRES_GPU.findall(node.get("Gres", "")))
            out.append(
                NodeInfo(
                    index=index,
                    name=name,
                    address=node.get("NodeAddr") or name,
                    cpus=float(node.get("CPUTot") or node.get("CPUEfctv") or 1),
                    gpus=min(gres, self.gpus_per_node),
                )
            )
        return out

    def ended(self) -> str:
        """``"NODE_FAIL (Reason=...)"`` once the allocation has ended, else '' (looked up every POLL_S)."""
        seen_at, ended = self._seen
        if ended or self._job_id is None or time.monotonic() - seen_at < POLL_S:
            return ended
        done = self.run(["scontrol", "show", "job", self._job_id, "-o"], check=False, timeout=10.0)
        fields = parse_key_values(done.stdout.strip()) if done.returncode == 0 else {}
        state = fields.get("JobState", "")
        if state and state not in LIVE_STATES:
            ended = f"{state} (Reason={fields.get('Reason', '?')})"
            logger.error("SLURM allocation %s has ended: %s", self._job_id, ended)
        self._seen = (time.monotonic(), ended)
        return ended

    def node_note(self, node: NodeInfo) -> str:
        """``SLURM reports node 1 (...) as DOWN* (Not responding)...`` when the node is not up, else ''."""
        done = self.run(["scontrol", "show", "node", node.name, "-o"], check=False, timeout=10.0)
        fields = parse_key_values(done.stdout.strip()) if done.returncode == 0 else {}
        state = fields.get("State", "")
        if any(bad in state for bad in ("DOWN", "NOT_RESPONDING", "FAIL", "DRAIN")) or state.endswith("*"):
            reason = fields.get("Reason", "")
            return f"SLURM reports {node.label} as {state}" + (f" ({reason})" if reason else "") + ": the node was lost"
        return ""

    def pick_ports(self, node: NodeInfo, count: int, held: list[int], python: str) -> list[int]:
        """``count`` free ports on ``node`` (none of ``held``), probed there by a short step."""
        argv = [
            "srun",
            f"--jobid={self.job_id}",
            "--overlap",
            "--nodes=1",
            "--ntasks=1",
            f"--nodelist={node.name}",
            "--immediate=30",
            f"--job-name={self.name}-ports",
            python,
            "-m",
            "areal_tasks.launch.ports",
            "--count",
            str(count),
            "--host",
            node.address,
        ]
        if held:
            argv += ["--exclude", ",".join(str(p) for p in held)]
        done = self.run(argv, timeout=60.0)
        try:
            ports = [int(p) for p in done.stdout.split()]
        except ValueError:
            ports = []
        if len(ports) != count:
            raise SchedulerError(
                f"picking {count} port(s) on {node.label} printed {done.stdout!r} (stderr: {done.stderr.strip()})"
            )
        return ports

    def step_ids(self) -> dict[str, str]:
        """``step name -> "<job>.<step>"`` of the running steps ({} when SLURM cannot say)."""
        if self._job_id is None:
            return {}
        done = self.run(["squeue", "-h", "-s", "-j", self._job_id, "-o", "%i|%j"], check=False)
        if done.returncode != 0:
            logger.warning("squeue of the steps of %s failed: %s", self._job_id, done.stderr.strip())
            return {}
        return {row["name"]: row["id"] for row in parse_rows(done.stdout, ("id", "name"))}

    def scancel_step(self, step: str, signal_name: str | None) -> None:
        """``scancel [--signal=SIG] ID.STEP`` (its exit 225 after a delivered signal is not an error)."""
        argv = ["scancel", *([f"--signal={signal_name}"] if signal_name else []), step]
        done = self.run(argv, check=False)
        if done.returncode not in (0, SCANCEL_STEP_QUIRK):
            logger.warning("%s exited %d: %s", " ".join(argv), done.returncode, done.stderr.strip())

    def release(self) -> None:
        """Cancel the allocation if this object took it; a later use takes a new one."""
        with self._lock:
            if self.own and self._job_id is not None:
                job_id = self._job_id
                self._job_id, self.own, self._nodes, self._seen = None, False, None, (0.0, "")
                logger.info("cancelling SLURM allocation %s", job_id)
                self.run(["scancel", job_id])
