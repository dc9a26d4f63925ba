"""Train engines and what they share: the registry of training backends (``registry.py``; FSDP2 in
``fsdp/``), the device mesh and parallelisms (``parallel/``), the checkpointable role of torch-module
engines (``module_state.py``), micro-batching, memory estimation, weight senders."""
