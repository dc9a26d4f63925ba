"""The rows of the inference throughput benchmark (``inference_throughput.py``): its sampling modes,
the workloads it runs through the engine and through ``areal serve`` (each mode at each concurrency,
and the GRPO group pair), and the option parsing that picks them.

A workload is a list of prompts, each asked for ``n`` samples: ``n > 1`` is one request per prompt
whose samples share one prefill (the server's ``SequenceGroup``); the GRPO comparison sends the same
sequences as ``n`` separate requests of each prompt instead (each its own group, prefilled anew
unless the prefix cache is on).
"""

from __future__ import annotations

from dataclasses import dataclass

#: the sampling modes: key -> (table label, SGLang ``sampling_params``).
MODES: dict[str, tuple[str, dict]] = {
    "greedy": ("greedy", {"temperature": 0.0}),
    "t1": ("T=1", {"temperature": 1.0}),
    "top_p": ("T=1 top_p 0.9", {"temperature": 1.0, "top_p": 0.9}),
    "top_k": ("T=1 top_k 50", {"temperature": 1.0, "top_k": 50}),
}
#: the mode of the GRPO group rows (RL's usual sampling); they run whenever this mode does.
GROUP_MODE = "top_p"


@dataclass(frozen=True)
class Workload:
    """One row: every prompt of ``prompts`` submitted at once, each asking for ``n`` samples."""

    #: the row's key in the report (``mode`` / ``kind`` / sequences), shared by its engine and HTTP rows.
    key: str
    label: str
    mode: str
    kind: str  # "requests", "group" (one n-sample request a prompt) or "independent" (n requests a prompt)
    prompts: list[list[int]]
    n: int = 1

    @property
    def sampling(self) -> dict:
        return MODES[self.mode][1]

    @property
    def sequences(self) -> int:
        """Sequences generated: the row's batch."""
        return len(self.prompts) * self.n


def parse_sizes(text: str, option: str) -> list[int]:
    """A comma-separated list of positive integers; raises ValueError naming ``option``."""
    try:
        sizes = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"{option} takes comma-separated integers, got {text!r}") from None
    if any(size < 1 for size in sizes):
        raise ValueError(f"{option}: every size must be at least 1, got {text!r}")
    return sizes


def parse_modes(text: str | None, sampling: bool) -> list[str]:
    """``--modes`` (comma-separated keys of :data:`MODES`); unset: all of them with ``--sampling``,
    greedy alone without. Raises ValueError naming an unknown mode."""
    if text is None:
        return list(MODES) if sampling else ["greedy"]
    modes = [m.strip() for m in text.split(",") if m.strip()]
    if unknown := sorted(set(modes) - set(MODES)):
        raise ValueError(f"--modes: unknown {unknown}; choose from {', '.join(MODES)}")
    if not modes:
        raise ValueError("--modes names no mode; leave it out for the default")
    return [m for m in MODES if m in modes]  # the table's order


def matrix(modes: list[str], levels: list[int], prompts: list[list[int]]) -> list[Workload]:
    """Each mode at each concurrency: the first ``level`` prompts, one sequence each."""
    return [
        Workload(f"{mode}/requests/{level}", MODES[mode][0], mode, "requests", prompts[:level])
        for mode in modes
        for level in levels
    ]


def group_pair(sequences: int, n: int, prompts: list[list[int]]) -> list[Workload]:
    """GRPO at ``sequences`` sequences in :data:`GROUP_MODE`: ``sequences // n`` prompts as one
    ``n``-sample request each, then the same prompts as ``n`` separate requests each."""
    count = sequences // n
    if count < 1:
        raise ValueError(f"--groups {n} is larger than the first --concurrency ({sequences}); lower one of them")
    chosen = prompts[:count]
    label = MODES[GROUP_MODE][0]
    return [
        Workload(f"{GROUP_MODE}/group{n}/{count * n}", f"{label}, n={n} a request", GROUP_MODE, "group", chosen, n),
        Workload(
            f"{GROUP_MODE}/independent{n}/{count * n}",
            f"{label}, {n} requests a prompt",
            GROUP_MODE,
            "independent",
            [p for p in chosen for _ in range(n)],
        ),
    ]
