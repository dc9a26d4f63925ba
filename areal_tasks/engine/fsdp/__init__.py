"""The FSDP2 train engine: ``fully_shard`` per decoder block (or the model as one unit, or flat
buffers without FSDP) on the dp x sp x tp mesh of ``engine/parallel/``, with its DTensor tensor
parallelism and Ulysses sequence parallelism, LoRA (``models/lora.py``) and the critic variant
(``models/critic.py``); kernels from ``areal_tasks/kernels/``.

Import :class:`areal_tasks.engine.fsdp.engine.FSDPEngine` explicitly; this package imports no torch.
"""
