"""Inference: the client that rollout code uses to reach inference servers, and the servers.

* ``client/``: the shared HTTP client core (:class:`RemoteInferenceEngine`, an
  ``areal_tasks.api.inference.InferenceEngine``) with one thin protocol adapter per backend
  (``sglang``, ``embedded``, ``vllm``);
* ``launch/``: command lines of each backend's server and the ``ServerFleet`` that starts,
  health-checks, restarts and stops them through the Scheduler;
* ``server/``: the embedded SGLang-protocol server (``areal serve``; imports torch);
* ``registry.py``: the one list of inference backends (adapter, launcher, constraints of each).

Nothing is imported here, so that ``import areal_tasks.inference.launch`` (or ``.registry``, which the
config package reads) stays light.
"""
