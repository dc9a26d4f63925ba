"""Pipeline parallelism for the archon engine, on ``torch.distributed.pipelining``.

* ``split.py``: which decoder layers each pipeline stage holds (contiguous, balanced by parameter
  count, FLOPs or layer count, with the embedding and the head as extras of the first and last stage);
* ``stages.py``: where the stages live (``loop``: stage ``s`` on rank ``s % pp``; ``v``: rank ``r``
  holds stages ``r`` and ``2 pp - 1 - r``) and this rank's stage modules, pruned from the full decoder
  so that their parameter names stay the global ones (``layers.5.self_attn.q_proj.weight``);
* ``schedule.py``: schedule names -> torch schedule classes and the static stage shapes;
* ``runner.py``: :class:`PipelineRunner`, which runs our packed micro-batches through the schedule with
  the engine's loss contract (each micro-batch's loss scaled by ``weight / total_weight``), and the
  forward-only path for log-prob/value forwards.

Every pp rank must be handed the same micro-batches (the pipeline's ranks share one data-parallel
coordinate); the stats and forward outputs of the last stage are broadcast to all of them.
"""
