"""The archon train engine: a plain-PyTorch decoder with pipeline, expert, tensor and context
parallelism composed with FSDP2."""
