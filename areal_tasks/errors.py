"""The one exception hierarchy of ``areal_tasks``.

Every error the package raises on purpose derives from :class:`AReaLError`, so callers (the CLI,
Airflow operators) can tell a user-facing failure from a bug. Messages name what was wrong, the
offending value and how to fix it.
"""

from __future__ import annotations


class AReaLError(Exception):
    """Root of every error that areal_tasks raises on purpose."""


class ConfigError(AReaLError, ValueError):
    """A configuration value, file or override is invalid."""


class AllocationError(ConfigError):
    """An allocation-mode string does not parse or does not validate.

    ``position`` is the 0-based character offset of the problem in ``spec`` when known.
    """

    def __init__(self, message: str, spec: str = "", position: int | None = None, hint: str = "") -> None:
        self.spec = spec
        self.position = position
        self.hint = hint
        super().__init__(message)

    def __str__(self) -> str:
        text = self.args[0] if self.args else ""
        if self.spec and self.position is not None:
            text += f"\n  {self.spec}\n  {' ' * self.position}^"
        if self.hint:
            text += f"\n  hint: {self.hint}"
        return text


class ModelError(AReaLError):
    """A model directory, hub id, tokenizer or architecture cannot be used."""


class SchedulerError(AReaLError):
    """A worker group could not be started, became unhealthy, or could not be stopped."""


class WorkerFailedError(SchedulerError):
    """A worker exited unexpectedly; the message carries its exit code and the tail of its log."""


class ReadinessTimeoutError(SchedulerError):
    """A worker did not become ready within its timeout."""


class AlgorithmError(AReaLError, ValueError):
    """An RL algorithm received inputs or settings it cannot work with."""


class EngineError(AReaLError):
    """A train engine cannot be built, cannot run a batch, or cannot save/load/export weights."""


class WeightTransportError(AReaLError):
    """A weight update cannot be planned, sent or received: a tensor stream, bucket or shared buffer
    that does not match its plan or the served model, or a weight-update group that cannot be used."""


class InferenceError(AReaLError):
    """An inference server or the client that talks to it failed."""


class InferenceRequestError(InferenceError):
    """A server refused a generation request (a 4xx answer or an abort carrying an error); not retried.
    ``param`` names the request field at fault when one is (OpenAI's error ``param``)."""

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class InferenceLimitError(InferenceRequestError):
    """A server refused a request by one of its limits: too large (HTTP 413), or not now because its
    queue is full (HTTP 429 with ``Retry-After``: ``retry_after_s`` is set)."""

    def __init__(self, message: str, *, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s

    @property
    def status_code(self) -> int:
        """413 (the request can never be served as it is) or 429 (try again after ``retry_after_s``)."""
        return 413 if self.retry_after_s is None else 429


class InferenceConnectionError(InferenceError):
    """A server could not be reached or broke the connection; the client retries elsewhere."""


class InferenceTimeoutError(InferenceConnectionError):
    """A server did not answer within the request timeout; the client retries."""


class InferenceRetriesExhaustedError(InferenceError):
    """A generation request failed on every attempt (timeouts, dead servers, 5xx); the message lists them."""


class InferenceControlError(InferenceError):
    """A control call (pause, resume, weight update, health) failed on at least one server."""


class InferenceServerFailedError(InferenceError):
    """An inference server crashed more often than ``max_restarts`` allows, or never became healthy."""


class CheckpointError(AReaLError):
    """A checkpoint cannot be saved, found, read, pruned or exported (the message names the location)."""


class CheckpointIntegrityError(CheckpointError):
    """A checkpoint's stored bytes are not what its save wrote: a file missing, truncated, unparsable or
    failing its recorded sha256. The message names the file and, for tensor data, the item; ``file``
    and ``item`` hold them when known."""

    file: str | None = None
    item: str | None = None


class RolloutError(AReaLError):
    """The rollout side failed: a workflow, the executor, or too many failed episodes."""


class TrajectoryError(RolloutError, ValueError):
    """A workflow returned a trajectory whose per-token lists, prompt length or reward are invalid."""


class RewardError(RolloutError):
    """A reward function is unknown, cannot be imported, failed, or ran past its timeout."""


class RewardTimeoutError(RewardError):
    """A reward function ran past its timeout (its worker process, if it had one, was killed and replaced)."""


class AgentError(AReaLError):
    """Agent code, the OpenAI-compatible client (``ArealOpenAI``) or the agent proxy failed or was misused."""


class AgentRequestError(AgentError, ValueError):
    """A request to ``ArealOpenAI`` or the proxy that cannot be served; ``param`` names the field at
    fault when one is (OpenAI's error ``param``), so the proxy answers 400 naming it."""

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class EvaluationError(AReaLError, ValueError):
    """Evaluation inputs that cannot be scored (e.g. ``k`` larger than an item's sample count); the
    message names the item at fault."""


class TraceError(AReaLError):
    """A perf trace that cannot be written or merged (no part files, an unreadable run directory)."""


class ReportError(AReaLError):
    """A run report that cannot be made: the directory is not a run dir, or the output is not writable.
    The message names the path and what a run dir holds."""
