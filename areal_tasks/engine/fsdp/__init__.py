"""The FSDP2 train engine: a dp x sp x tp device mesh, ``fully_shard`` per decoder block, DTensor
tensor parallelism, Ulysses sequence parallelism, LoRA through peft and a critic variant.

Import :class:`areal_tasks.engine.fsdp.engine.FSDPEngine` explicitly; this package imports no torch.
"""
