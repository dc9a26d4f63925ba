"""One rank without FSDP (``fsdp_wrap="none"``): flat fp32 master weights and gradients, and a
compute-dtype copy of the weights that the model runs with.

With one rank per shard group FSDP2 shards nothing, yet it still does per-parameter host work
every step: it casts each parameter before the forward and, at the end of each backward, copies
the gradients into a reduce buffer, "reduces" them on the one rank and wraps each in a new
DTensor. On a GPU the 0.5B shape's step left the device idle at the end of the backward while
the host did that, and clipping and AdamW then walked 290 DTensor gradients
(docs/benchmarks_history.md, "Train throughput", seventh and eighth sessions).

:class:`FlatParams` keeps what the engine trains in four flat buffers instead:

- ``master`` (fp32): the model's own parameters are re-pointed at views of it, so the optimizer,
  state dicts, checkpoints and weight export see the same plain fp32 tensors as before;
- ``compute`` (the compute dtype, e.g. bf16): one leaf parameter per master parameter, a view of
  it, installed on the modules for the duration of a step (:meth:`computing`) and refreshed from
  the masters by one copy when the step starts;
- ``master_grad``: the compute parameters have no ``.grad`` when a backward starts, so autograd
  hands each one the gradient tensor it computed, without a kernel (a ``.grad`` already there
  would cost an add per parameter, and zeroing it one more pass). After each backward
  :meth:`accumulate` adds them into ``master_grad`` in fp32 (the first after :meth:`zero_grad`
  writes) and drops them. On CUDA with Triton that is one kernel reading every gradient where
  autograd left it (``flat_grad_kernels.py``); elsewhere (or for a gradient the kernel cannot
  read) a batched concatenation into a flat compute-dtype buffer (``compute_grad``, allocated on
  first use) and one casting copy or add. The master parameters' ``.grad`` are views of
  ``master_grad``: micro-batches add up in fp32, as FSDP's fp32 reduction did. The per-parameter
  adds and the zeroing this replaced cost a kernel launch per parameter and micro-batch
  (docs/benchmarks_history.md, "Train throughput", ninth session).

Tied parameters (Qwen2.5-0.5B's embeddings and LM head) are one master and one compute parameter,
installed on every module that holds them. Only for a plain dense model on one rank: no tensor
parallelism (its parameters are DTensors), no LoRA (peft's frozen base would need no gradient
buffers), no CPU offload; the engine refuses those by name.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from areal_tasks.engine.fsdp import flat_grad_kernels
from areal_tasks.errors import EngineError

__all__ = ["FlatParams"]


@dataclass
class _Slot:
    """Where a parameter is attached: ``module._parameters[name]``."""

    module: torch.nn.Module
    name: str


class FlatParams:
    """The flat buffers of one model (see the module docstring). Build it after the model is on its
    device and before the optimizer; ``trainable`` = whether gradients are kept at all."""

    def __init__(self, model: torch.nn.Module, compute_dtype: torch.dtype, *, trainable: bool = True) -> None:
        self.model = model
        self.compute_dtype = compute_dtype
        self.params: list[torch.nn.Parameter] = []
        slots: dict[int, list[_Slot]] = {}
        for module in model.modules():
            for name, param in module._parameters.items():
                if param is None:
                    continue
                if id(param) not in slots:
                    self.params.append(param)
                    slots[id(param)] = []
                slots[id(param)].append(_Slot(module, name))
        if not self.params:
            raise EngineError("fsdp_wrap=none: the model has no parameters")
        devices = {p.device for p in self.params}
        if len(devices) != 1 or any(p.dtype != torch.float32 for p in self.params):
            raise EngineError(
                f"fsdp_wrap=none needs fp32 parameters on one device, got devices {devices} and "
                f"dtypes {sorted({str(p.dtype) for p in self.params})}"
            )
        (device,) = devices
        self._slots = [slots[id(p)] for p in self.params]
        sizes = [p.numel() for p in self.params]
        total = sum(sizes)
        self.master = torch.empty(total, dtype=torch.float32, device=device)
        self.compute = torch.empty(total, dtype=compute_dtype, device=device)
        with torch.no_grad():
            for param, view in zip(self.params, self._views(self.master, sizes)):
                view.copy_(param.reshape(-1))
                param.data = view.view(param.shape)
        self.compute_params = [
            torch.nn.Parameter(view.view(param.shape), requires_grad=param.requires_grad and trainable)
            for param, view in zip(self.params, self._views(self.compute, sizes))
        ]
        self.trainable = trainable and any(p.requires_grad for p in self.params)
        self.compute_grad: torch.Tensor | None = None  # the torch-op path's buffer, on first use
        self.master_grad = None
        #: the one-kernel accumulation's tables (CUDA with Triton), else None
        self.grad_table: flat_grad_kernels.BlockTable | None = None
        if self.trainable:
            self.master_grad = torch.zeros(total, dtype=torch.float32, device=device)
            if device.type == "cuda" and flat_grad_kernels.kernels_available():
                self.grad_table = flat_grad_kernels.BlockTable(sizes, device)
            self._master_grad_views = [
                view.view(p.shape) for p, view in zip(self.params, self._views(self.master_grad, sizes))
            ]
        self._installed = False
        #: the master gradients hold nothing yet: the next :meth:`accumulate` writes instead of adding
        self._fresh = True

    @staticmethod
    def _views(flat: torch.Tensor, sizes: list[int]) -> list[torch.Tensor]:
        return list(torch.split(flat, sizes))

    # ------------------------------------------------------------------ steps
    @contextlib.contextmanager
    def computing(self) -> Iterator[None]:
        """Within the block the modules hold the compute parameters, refreshed from the masters on
        entry; on exit (also after an error) the masters are back. Not reentrant."""
        if self._installed:
            raise EngineError("FlatParams.computing is already active (it is not reentrant)")
        with torch.no_grad():
            self.compute.copy_(self.master)
        self._install(self.compute_params)
        try:
            yield
        except BaseException:
            if self.trainable:  # a backward cut short may have left gradients that were never accumulated
                self._drop_compute_grads()
            raise
        finally:
            self._install(self.params)

    def accumulate(self) -> None:
        """Add the compute gradients of the backward just run into the fp32 master gradients (one
        kernel, or a batched concatenation and one add: see the module docstring) and drop them.
        A parameter that got no gradient (unused in the micro-batch, or frozen) adds zeros."""
        if not self.trainable:
            raise EngineError("this model was flattened without gradients (trainable=False)")
        grads = [param.grad for param in self.compute_params]
        with torch.no_grad():
            if self.grad_table is not None and all(flat_grad_kernels.can_read(g, self.compute) for g in grads):
                flat_grad_kernels.accumulate_into(
                    self.master_grad, grads, self.grad_table, self.compute, fresh=self._fresh
                )
            else:
                self._accumulate_by_ops(grads)
        self._drop_compute_grads()
        self._fresh = False
        self._attach_master_grads()

    def zero_grad(self) -> None:
        """Forget the master gradients: their ``.grad`` is None until the next :meth:`accumulate`,
        which overwrites the buffer instead of adding to it (no zeroing kernel), as
        ``set_to_none`` would (a checkpoint loader initialises a fresh optimizer's state only while
        no parameter has a gradient)."""
        if not self.trainable:
            return
        self._fresh = True
        for param in self.params:
            param.grad = None

    # --------------------------------------------------------------- helpers
    def _accumulate_by_ops(self, grads: list[torch.Tensor | None]) -> None:
        """:meth:`accumulate` in torch ops: one batched concatenation, one casting copy or add."""
        if self.compute_grad is None:
            self.compute_grad = torch.empty_like(self.compute)
        pieces = [
            grad.reshape(-1)
            if grad is not None
            else torch.zeros(param.numel(), dtype=self.compute_dtype, device=self.compute.device)
            for grad, param in zip(grads, self.compute_params)
        ]
        torch.cat(pieces, out=self.compute_grad)
        if self._fresh:
            self.master_grad.copy_(self.compute_grad)
        else:
            self.master_grad.add_(self.compute_grad)

    def _drop_compute_grads(self) -> None:
        for param in self.compute_params:
            param.grad = None

    def _install(self, params: list[torch.nn.Parameter]) -> None:
        for param, slots in zip(params, self._slots):
            for slot in slots:
                slot.module._parameters[slot.name] = param
        self._installed = params is self.compute_params

    def _attach_master_grads(self) -> None:
        """Point every trainable master parameter's ``.grad`` at its view of ``master_grad`` (an
        optimizer's ``zero_grad(set_to_none=True)`` or a user may have dropped it)."""
        for param, view in zip(self.params, self._master_grad_views):
            if param.requires_grad and param.grad is not view:
                param.grad = view
