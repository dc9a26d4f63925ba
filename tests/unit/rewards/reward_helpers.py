"""Reward functions for the runner tests: ones that hang, crash, die, or return bad values.

Imported as the top-level module ``reward_helpers`` (see conftest.py), also by worker processes.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from typing import Any

NOT_CALLABLE = 3
RELEASE = threading.Event()  # lets in-process tests end a "hung" reward


def pid(completion: str, answer: str, **_: Any) -> float:
    """The process id that ran the reward."""
    return float(os.getpid())


def slow_pid(completion: str, answer: str, *, delay: float = 0.3, **_: Any) -> float:
    """Sleep ``delay`` seconds, then the process id."""
    time.sleep(delay)
    return float(os.getpid())


def hang(completion: str, answer: str, **_: Any) -> float:
    """Never finishes in test time."""
    time.sleep(60)
    return 1.0


def hang_with_child(completion: str, answer: str, *, pid_file: str, **_: Any) -> float:
    """Start a grandchild process, record its pid, then hang."""
    child = subprocess.Popen(["sleep", "60"])
    with open(pid_file, "w") as f:
        f.write(str(child.pid))
    time.sleep(60)
    return 1.0


def block(completion: str, answer: str, **_: Any) -> float:
    """Hang until RELEASE is set (for in-process tests)."""
    RELEASE.wait(60)
    return 1.0


def crash(completion: str, answer: str, **_: Any) -> float:
    """Raise an ordinary exception."""
    raise ValueError(f"boom on {completion!r}")


def die(completion: str, answer: str, **_: Any) -> float:
    """Kill the whole process running the reward."""
    os._exit(7)


def not_finite(completion: str, answer: str, **_: Any) -> float:
    """A float that is not finite."""
    return float(completion)


def not_a_number(completion: str, answer: str, **_: Any) -> Any:
    """A string instead of a number."""
    return "1.0"


def heavy_modules(completion: str, answer: str, **_: Any) -> float:
    """1.0 if the process has imported torch, pytest or the caller's test modules, else 0.0."""
    heavy = ("torch", "pytest", "_pytest", "numpy")
    return 1.0 if any(name in sys.modules for name in heavy) else 0.0


def noisy(completion: str, answer: str, **_: Any) -> float:
    """Prints to stdout (which must not corrupt the worker protocol)."""
    print("some chatter from the reward " * 10)
    return 0.5


def raise_timeout(completion: str, answer: str, **_: Any) -> float:
    """A reward whose own failure is a TimeoutError (not the runner's timeout)."""
    raise TimeoutError("upstream service timed out")
