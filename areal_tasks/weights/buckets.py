"""Flattened buckets: many tensors as one ``uint8`` tensor, their bytes back to back.

The wire form of a collective update (one broadcast per bucket) and the layout of a shared buffer
(all tensors as one bucket). The plan (:func:`~areal_tasks.api.inference.plan_weight_buckets`)
orders each bucket so that every tensor's byte offset is a multiple of its element size, as
SGLang's ``flattened_bucket`` receiver requires.

Sending side: :func:`flatten_bucket` packs tensors into a fresh wire tensor, :func:`bucket_views`
gives the slices of an existing one, :func:`check_bucket_tensor` says whether a tensor may fill
a slice. Receiving side: :func:`split_flat` takes the views back from the names, dtypes and shapes
a server was sent (untrusted: lengths, dtypes and alignment are checked).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from areal_tasks.api.inference import ParamSpec
from areal_tasks.errors import WeightTransportError

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

__all__ = ["bucket_views", "check_bucket_tensor", "dtype_of", "flat_bytes", "flatten_bucket", "spec_of", "split_flat"]


def spec_of(name: str, tensor: torch.Tensor) -> ParamSpec:
    """The :class:`ParamSpec` of one tensor (works on ``meta``-device tensors too)."""
    return ParamSpec(name, str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape))


def bucket_views(flat: torch.Tensor, bucket: Sequence[ParamSpec]) -> dict[str, torch.Tensor]:
    """The slices of the ``uint8`` tensor ``flat`` that hold ``bucket``'s tensors back to back, by
    name, each viewed in its spec's dtype and shape (no copy). ``flat`` must hold exactly the
    bucket's bytes (:class:`WeightTransportError` otherwise)."""
    import torch

    nbytes = sum(spec.nbytes for spec in bucket)
    if flat.numel() != nbytes:
        raise WeightTransportError(
            f"the flat tensor holds {flat.numel()} bytes, the bucket's {len(bucket)} tensors {nbytes}"
        )
    views, offset = {}, 0
    for spec in bucket:
        views[spec.name] = flat[offset : offset + spec.nbytes].view(getattr(torch, spec.dtype)).view(spec.shape)
        offset += spec.nbytes
    return views


def check_bucket_tensor(spec: ParamSpec, tensor: torch.Tensor) -> None:
    """Raise :class:`WeightTransportError` unless ``tensor`` can fill ``spec``'s slice: the same
    shape, and the same dtype or a floating-point one the copy casts to the spec's floating-point dtype."""
    import torch

    wire_dtype = getattr(torch, spec.dtype)
    castable = tensor.is_floating_point() and wire_dtype.is_floating_point
    if tuple(tensor.shape) != spec.shape or (tensor.dtype != wire_dtype and not castable):
        raise WeightTransportError(f"{spec.name}: tensor is {spec_of(spec.name, tensor)}, the bucket plan says {spec}")


def flatten_bucket(
    bucket: Sequence[ParamSpec], tensors: Mapping[str, torch.Tensor], device: torch.device
) -> torch.Tensor:
    """One bucket's wire tensor: the bytes of ``tensors[spec.name]`` back to back, in ``bucket`` order.

    The wire tensor is allocated once and every tensor is copied straight into its slice
    (:func:`bucket_views`); a floating-point tensor is cast to its spec's floating-point dtype by
    that copy (the trainer's fp32 master weights go out as bf16 without a cast copy first). Raises
    :class:`WeightTransportError` when a tensor is missing, has another shape, or has another dtype
    that is not such a cast (:func:`check_bucket_tensor`).
    """
    import torch

    flat = torch.empty(sum(spec.nbytes for spec in bucket), dtype=torch.uint8, device=device)
    views = bucket_views(flat, bucket)
    for spec in bucket:
        tensor = tensors.get(spec.name)
        if tensor is None:
            raise WeightTransportError(f"weight bucket names {spec.name!r}, but no such tensor was given")
        check_bucket_tensor(spec, tensor)
        views[spec.name].copy_(tensor.detach())
    return flat


def dtype_of(name: str) -> torch.dtype:
    """The torch dtype a wire name (``bfloat16`` or ``torch.bfloat16``) stands for."""
    import torch

    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise WeightTransportError(f"unknown dtype {name!r}")
    return dtype


def flat_bytes(names: Sequence[str], types: Sequence[torch.dtype], shapes: Sequence[Sequence[int]]) -> int:
    """Bytes of the tensors back to back; raises :class:`WeightTransportError` when one is unaligned."""
    import torch

    if not len(names) == len(types) == len(shapes):
        raise WeightTransportError(f"names ({len(names)}), dtypes ({len(types)}) and shapes ({len(shapes)}) differ")
    total = 0
    for name, dtype, shape in zip(names, types, shapes):
        if total % dtype.itemsize:
            raise WeightTransportError(f"unaligned tensor {name}: byte offset {total}, dtype {dtype}")
        total += torch.Size(shape).numel() * dtype.itemsize
    return total


def split_flat(
    flat: torch.Tensor, names: Sequence[str], types: Sequence[torch.dtype], shapes: Sequence[Sequence[int]]
) -> dict[str, torch.Tensor]:
    """Views of the tensors lying back to back in the ``uint8`` tensor ``flat`` (no copy)."""
    import torch

    needed = flat_bytes(names, types, shapes)
    if flat.numel() != needed:
        raise WeightTransportError(f"the flat buffer holds {flat.numel()} bytes, the tensors listed need {needed}")
    views, start = {}, 0
    for name, dtype, shape in zip(names, types, shapes):
        size = torch.Size(shape).numel() * dtype.itemsize
        views[name] = flat[start : start + size].view(dtype).reshape(shape)
        start += size
    return views
