"""Parallelisms shared by the train engines: the dp x sp x tp device mesh (``mesh.py``:
``ParallelDims``, ``EngineMesh``), DTensor tensor-parallel plans (``tensor_parallel.py``) and Ulysses
sequence parallelism on packed sequences (``ulysses.py``).

Importing this package imports no torch; ``ParallelDims`` is torch-free (the trainer builds it from
the allocation), the mesh and the plans import torch when used.
"""
