"""Parallelisms specific to the archon engine: expert parallelism for MoE layers
(``expert_parallel.py``: token dispatch to the experts of an ep group and back) and the padded row
layout that a grouped GEMM over the dispatched tokens needs (``grouped_layout.py``).

Importing this package imports no torch; the modules in it do.
"""
