"""The archon train engine: a plain-PyTorch decoder, torch pipelining, expert parallelism, TP/CP with FSDP2."""
