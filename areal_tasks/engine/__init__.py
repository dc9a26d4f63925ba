"""Train engines (FSDP2, Megatron, Archon) and what they share: micro-batching, memory estimation,
weight senders."""
