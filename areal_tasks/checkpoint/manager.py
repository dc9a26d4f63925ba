"""``CheckpointManager``: what the trainer calls to save, resume, list and prune checkpoints.

Build one per run on every rank at the same point (it creates the checkpoint process group)::

    manager = CheckpointManager.from_config(job)            # or CheckpointManager(url, options, ...)
    state = manager.recover(job.recover.mode, {"actor": actor})   # None: start fresh
    for step in range(start, total + 1):
        ...train...
        if manager.should_save(step, last=step == total):
            manager.save(step, {"actor": actor}, TrainerState(step=step, ...), metrics, config=job)
    manager.close()                                         # waits for an async save in flight

Saves are collective (every rank calls them with its own engines). A save is crash-safe (see
:mod:`areal_tasks.checkpoint.save`), incremental against the previous checkpoint by default (see
:mod:`areal_tasks.checkpoint.incremental`), optionally async (:mod:`areal_tasks.checkpoint.async_save`),
and followed by pruning (:mod:`areal_tasks.checkpoint.retention`). A complete checkpoint is never
overwritten: other checkpoints may reference its data.

Reading checks before it applies (:mod:`areal_tasks.checkpoint.verify`): ``metadata.json`` against
``_COMPLETE``, the JSON state files against ``metadata.json``, and (``verify``, on by default; the job's
``recover.verify``) every tensor item against its sha256. ``recover`` falls back from a damaged
checkpoint to the newest intact one, quarantining the damaged ones so they are never picked again.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from areal_tasks.api.train_engine import CheckpointableEngine
from areal_tasks.checkpoint.async_save import AsyncSaver
from areal_tasks.checkpoint.group import CheckpointGroup
from areal_tasks.checkpoint.layout import (
    COMPLETE_MARKER,
    QUARANTINE_MARKER,
    CheckpointLayout,
    parse_step_dir,
    step_dir,
)
from areal_tasks.checkpoint.metadata import CheckpointMetadata, config_payload
from areal_tasks.checkpoint.retention import PrunePlan, RetentionPolicy, apply_prune, plan_prune
from areal_tasks.checkpoint.state import TrainerState
from areal_tasks.checkpoint.verify import read_metadata, verify_step
from areal_tasks.config.sections import SaverConfig
from areal_tasks.errors import CheckpointError, CheckpointIntegrityError

if TYPE_CHECKING:
    from areal_tasks.checkpoint.listing import CheckpointInfo
    from areal_tasks.config.job import JobConfig
    from storage import Storage

logger = logging.getLogger(__name__)

RECOVER_MODES = ("auto", "resume", "disabled")


class SaveTicket:
    """A save in progress (async) or done (sync); :meth:`wait` returns its metadata or raises."""

    def __init__(self, step: int, future: Future[CheckpointMetadata]) -> None:
        self.step = step
        self._future = future

    def done(self) -> bool:
        return self._future.done()

    def wait(self) -> CheckpointMetadata:
        return self._future.result()


class CheckpointManager:
    """Checkpoints of one run under ``<storage_url>/<experiment>/<trial>/checkpoints``."""

    def __init__(
        self,
        storage_url: str | None,
        options: Mapping[str, Any] | None = None,
        experiment: str = "areal",
        trial: str = "trial0",
        saver_config: SaverConfig | None = None,
        *,
        incremental: bool = True,
        storage: Storage | None = None,
        group: CheckpointGroup | None = None,
        layout: CheckpointLayout | None = None,
        verify: bool = True,
    ) -> None:
        from storage import Storage

        self.saver_config = saver_config or SaverConfig()
        if self.saver_config.format != "dcp":
            raise CheckpointError(
                f"saver.format={self.saver_config.format!r}: the checkpoint manager writes resumable 'dcp' "
                "checkpoints; get an HF directory with `areal checkpoint export URL --hf OUT`"
            )
        if layout is None:
            if storage is None:
                if not storage_url:
                    raise CheckpointError("a checkpoint manager needs a storage URL (storage.url) or a Storage")
                storage = Storage.from_url(storage_url, options)
            layout = CheckpointLayout.for_run(storage, experiment, trial)
        self.layout = layout
        self.storage = layout.storage
        self.policy = RetentionPolicy.from_saver(self.saver_config)
        self.incremental = incremental
        #: whether loads compare hashes (metadata, JSON files, index, every tensor item); False compares none.
        self.verify = verify
        self.group = group or CheckpointGroup.create()
        self._async = AsyncSaver() if self.saver_config.async_save else None
        self._last_step: int | None = None
        self._metadata_cache: dict[int, CheckpointMetadata] = {}

    @classmethod
    def from_config(cls, job: JobConfig, **kwargs: Any) -> CheckpointManager:
        """The manager of ``job``: storage URL (default ``file://<run_dir>/storage``), names, saver,
        verification on load (``recover.verify``)."""
        url = job.storage.url
        if url is None:
            if not job.experiment.run_dir:
                raise CheckpointError("storage.url is unset and experiment.run_dir is unresolved: set one of them")
            url = f"file://{os.path.join(job.experiment.run_dir, 'storage')}"
        kwargs.setdefault("verify", job.recover.verify)
        return cls(url, job.storage.options, job.experiment.name, job.experiment.trial, job.saver, **kwargs)

    @classmethod
    def open(
        cls,
        checkpoints_url: str,
        options: Mapping[str, Any] | None = None,
        saver_config: SaverConfig | None = None,
        *,
        must_exist: bool = False,
    ) -> CheckpointManager:
        """A one-process manager of an existing checkpoints folder (``.../<exp>/<trial>/checkpoints``):
        what the CLI and the benchmarks use to list, inspect, prune and export (``must_exist``: a
        folder that is not there is a :class:`CheckpointError`)."""
        from storage import Storage

        layout = CheckpointLayout(Storage.from_url(checkpoints_url, options))
        if must_exist and not layout.storage.exists():
            raise CheckpointError(f"no checkpoints folder at {layout.url()}")
        return cls(None, saver_config=saver_config, layout=layout, group=CheckpointGroup(distributed=False))

    @property
    def url(self) -> str:
        """The URL of the checkpoints folder (what the CLI takes)."""
        return self.layout.url()

    # -- saving -----------------------------------------------------------------------------------

    def should_save(self, step: int, *, last: bool = False) -> bool:
        """Whether ``saver.freq_steps`` asks for a checkpoint after ``step`` (always at the last step)."""
        freq = self.saver_config.freq_steps
        return last or (freq is not None and freq > 0 and step % freq == 0)

    def save(
        self,
        step: int,
        engines: Mapping[str, CheckpointableEngine],
        trainer_state: TrainerState,
        metrics: Mapping[str, float] | None = None,
        config: Any = None,
    ) -> SaveTicket:
        """Checkpoint ``engines`` and ``trainer_state`` as step ``step`` (collective, every rank).

        Sync mode returns once the checkpoint is complete (and pruned). Async mode returns after the
        state is copied to host memory; the ticket completes when the data is written.
        """
        from areal_tasks.checkpoint.save import prepare_save, write_checkpoint

        if trainer_state.step != step:
            raise CheckpointError(f"trainer_state.step={trainer_state.step} differs from the step being saved ({step})")
        if self._async is not None:
            self._async.wait()  # one save in flight at most; raises the previous one's failure
        parent = self.group.on_coordinator(lambda: self._prepare_directory(step), f"preparing checkpoint step {step}")
        request = prepare_save(
            self.group,
            step,
            engines,
            trainer_state,
            metrics or {},
            config_payload(config),
            parent=parent,
            incremental=self.incremental,
            stage=self._async is not None,
        )

        def write() -> CheckpointMetadata:
            metadata = write_checkpoint(self.layout, self.group, request)
            self._last_step = step
            self._metadata_cache[step] = metadata
            self.group.on_coordinator(self._prune_now, f"pruning after checkpoint step {step} (which is saved)")
            return metadata

        if self._async is not None:
            return SaveTicket(step, self._async.submit(write))
        done: Future[CheckpointMetadata] = Future()
        done.set_result(write())
        return SaveTicket(step, done)

    def wait(self) -> CheckpointMetadata | None:
        """Wait for an async save in flight (re-raising its failure); its metadata, or None."""
        return self._async.wait() if self._async is not None else None

    def close(self) -> None:
        """Wait for the save in flight and stop the background writer."""
        if self._async is not None:
            self._async.close()

    def __enter__(self) -> CheckpointManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _referenced_dirs(self) -> set[str]:
        out: set[str] = set()
        for step in self.layout.complete_steps():
            try:
                out.update(self.metadata(step).references)
            except CheckpointError as exc:  # a damaged checkpoint's references are unknown: it cannot be used
                logger.warning("ignoring the references of %s: %s", self.layout.url(step_dir(step)), exc)
        return out

    def _prepare_directory(self, step: int) -> int | None:
        """Rank 0: refuse a complete directory, clear a partial or quarantined one, pick the parent step."""
        directory = step_dir(step)
        if self.layout.is_complete(step):
            raise CheckpointError(
                f"checkpoint {self.layout.url(directory)} already exists and is complete; it is never overwritten "
                "(later checkpoints may reference its data): resume from it, or use a new experiment.trial"
            )
        files = self.layout.files(step)
        if files:
            if directory in self._referenced_dirs():
                raise CheckpointError(
                    f"{self.layout.url(directory)} holds data that kept checkpoints reference; cannot save step {step} "
                    "there: resume from the latest checkpoint, or use a new experiment.trial"
                )
            what = (
                "quarantined checkpoint"
                if QUARANTINE_MARKER in files
                else "partial checkpoint left by an interrupted save"
            )
            logger.warning("removing the %s %s", what, self.layout.url(directory))
            self.layout.storage.delete(directory, recursive=True, missing_ok=True)
        if not self.incremental:
            return None
        if self._last_step is not None and self._last_step < step and self.layout.is_complete(self._last_step):
            return self._last_step
        earlier = [s for s in self.layout.complete_steps() if s < step]
        if not earlier:
            return None
        report = verify_step(self.layout, earlier[-1])
        if not report.ok:
            logger.warning(
                "not diffing against %s, which is damaged (%s): writing every byte of step %d",
                self.layout.url(step_dir(earlier[-1])),
                report.problems[0],
                step,
            )
            return None
        return earlier[-1]

    # -- reading ---------------------------------------------------------------------------------

    def latest(self) -> int | None:
        """The newest complete checkpoint's step (None when there is none). Local: no collective."""
        return self.layout.latest()

    def metadata(self, step: int) -> CheckpointMetadata:
        """The metadata of the complete checkpoint ``step``, checked against its ``_COMPLETE`` marker."""
        if step not in self._metadata_cache:
            if not self.layout.is_complete(step):
                raise CheckpointError(f"{self.layout.url(step_dir(step))} is not a complete checkpoint")
            self._metadata_cache[step] = read_metadata(self.layout, step)
        return self._metadata_cache[step]

    def list(self, *, deep: bool = False) -> list[CheckpointInfo]:
        """Every step directory, ascending, with its status; complete checkpoints are checked (cheap or
        ``deep``) and a damaged one is ``corrupt`` (:func:`~areal_tasks.checkpoint.listing.list_steps`)."""
        from areal_tasks.checkpoint.listing import list_steps

        return list_steps(self.layout, deep=deep)

    def load(
        self, step: int | None, engines: Mapping[str, CheckpointableEngine], *, verify: bool | None = None
    ) -> TrainerState:
        """Restore checkpoint ``step`` (None: the latest) into ``engines`` and this rank's RNGs
        (collective). Nothing is applied before it is checked (:func:`~areal_tasks.checkpoint.restore.
        load_step`); ``verify`` (default: the manager's) False compares no hash. Damage raises
        :class:`~areal_tasks.errors.CheckpointIntegrityError` on every rank, naming file and item."""
        from areal_tasks.checkpoint.restore import load_step

        self.wait()
        chosen = self.group.on_coordinator(lambda: self._resolve_step(step), "finding the checkpoint to load")
        trainer = load_step(self.layout, self.group, chosen, engines, verify=self.verify if verify is None else verify)
        self._last_step = chosen
        return trainer

    def _resolve_step(self, step: int | None) -> int:
        chosen = self.layout.latest() if step is None else step
        if chosen is None:
            raise CheckpointError(f"no complete checkpoint in {self.url}")
        if not self.layout.is_complete(chosen):
            raise CheckpointError(
                f"{self.layout.url(step_dir(chosen))} is not a complete checkpoint (an interrupted save?); "
                f"complete ones: {self.layout.complete_steps()}"
            )
        return chosen

    def recover(
        self, mode: str, engines: Mapping[str, CheckpointableEngine], *, verify: bool | None = None
    ) -> TrainerState | None:
        """``recover.mode``: ``auto`` loads the latest checkpoint if there is one, ``resume`` requires
        one, ``disabled`` starts fresh. Returns the trainer state to continue from, or None.

        A checkpoint that fails its checks (:meth:`load`) is quarantined and the next older complete
        one is tried: the run resumes from the newest intact checkpoint, and the log says which
        ones were skipped and why. When every one is damaged, recovery raises (never starts fresh).
        """
        if mode not in RECOVER_MODES:
            raise CheckpointError(f"recover.mode must be one of {RECOVER_MODES}, got {mode!r}")
        if mode == "disabled":
            return None
        self.wait()
        latest = self.group.on_coordinator(self.layout.latest, "looking for a checkpoint to recover from")
        if latest is None:
            if mode == "resume":
                raise CheckpointError(f"recover.mode=resume but {self.url} holds no complete checkpoint")
            logger.info("no checkpoint in %s: starting fresh", self.url)
            return None
        candidates = self.group.on_coordinator(
            lambda: [s for s in reversed(self.layout.complete_steps()) if s <= latest], "listing checkpoints"
        )
        skipped: list[str] = []
        for number, step in enumerate(candidates):
            try:
                state = self.load(step, engines, verify=verify)
            except CheckpointIntegrityError as exc:
                self._quarantine(step, exc, candidates[number + 1] if number + 1 < len(candidates) else None)
                skipped.append(f"{step_dir(step)} ({exc})")
                continue
            if skipped:
                logger.warning(
                    "resumed from %s, the newest intact checkpoint; skipped (and quarantined): %s",
                    self.layout.url(step_dir(step)),
                    "; ".join(skipped),
                )
            return state
        raise CheckpointError(
            f"no intact checkpoint in {self.url}: every complete one failed verification and was quarantined: "
            + "; ".join(skipped)
        )

    def _quarantine(self, step: int, exc: CheckpointIntegrityError, fallback: int | None) -> None:
        """Quarantine the damaged ``step`` (rank 0; every rank waits) and say what happens next."""
        self.group.on_coordinator(lambda: self.layout.quarantine(step, str(exc)), f"quarantining step {step}")
        self._metadata_cache.pop(step, None)
        logger.error(
            "checkpoint %s fails verification: %s; quarantined it (%s): %s",
            self.layout.url(step_dir(step)),
            exc,
            QUARANTINE_MARKER,
            f"falling back to {step_dir(fallback)}" if fallback is not None else "no older checkpoint is left",
        )

    # -- pruning ----------------------------------------------------------------------------------

    def prune(self) -> PrunePlan:
        """Apply retention now (collective; rank 0 deletes). Returns what was kept and removed."""
        self.wait()
        return self.group.on_coordinator(self._prune_now, "pruning checkpoints")

    def _prune_now(self) -> PrunePlan:
        dirs = self.layout.step_dirs()
        directories = {name: list(self.layout.files(step)) for step, name in dirs.items()}
        directories = {name: files for name, files in directories.items() if files}  # emptied: nothing to do
        complete = {}
        protect = set()
        for step, name in dirs.items():
            files = directories.get(name, ())
            if QUARANTINE_MARKER in files:
                protect.add(name)  # kept for inspection; removed when the run saves this step again
            elif COMPLETE_MARKER in files:
                try:
                    meta = self.metadata(step)
                except CheckpointError as exc:
                    logger.warning(
                        "pruning leaves %s alone: it cannot be read (%s); check it with `areal checkpoint verify`",
                        self.layout.url(name),
                        exc,
                    )
                    protect.add(name)
                    continue
                complete[step] = (meta.metrics, meta.references)
        plan = plan_prune(directories, complete, self.policy, protect)
        apply_prune(self.layout, plan)
        for name in [*plan.delete, *plan.strip]:
            step = parse_step_dir(name)
            if step is not None:
                self._metadata_cache.pop(step, None)
        return plan
