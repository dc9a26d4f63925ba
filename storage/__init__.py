"""fsspec storage for areal-tasks: URLs plus options, local/NFS and S3 backends, validation and
atomic commits. Knows nothing of RL. Filled in by the storage issue."""
