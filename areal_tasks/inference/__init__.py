"""Inference: the client that rollout code uses to reach inference servers, and the servers.

* ``client/``: the shared HTTP client core (:class:`RemoteInferenceEngine`, an
  ``areal_tasks.api.inference.InferenceEngine``) with one thin protocol adapter per backend
  (``sglang``, ``embedded``, ``vllm``);
* ``launch/``: command lines of each backend's server and the ``ServerFleet`` that starts,
  health-checks, restarts and stops them through the Scheduler;
* ``server/``: the embedded SGLang-protocol server (``areal serve``; imports torch).

Nothing is imported here, so that ``import areal_tasks.inference.launch`` stays light.
"""
