"""The archon train engine: a plain-PyTorch decoder with pipeline, expert, tensor and context
parallelism composed with FSDP2 (``engine.py``; the decoder in ``model/``, the parallel layouts in
``parallel/`` and ``pipeline/``)."""
