"""The Ray backend: worker groups as supervisor actors in one placement group, and detached jobs.

* :mod:`.scheduler`: ``RayScheduler`` (runs on a node of the Ray cluster: it is a Ray driver);
* :mod:`.supervisor`: the actor that starts, watches and stops one worker process on its node;
* :mod:`.reaper`: the watcher each supervisor leaves behind, which kills the worker's process tree
  when the actor dies (Ray kills only an actor's direct children);
* :mod:`.jobs`: ``RayJobs``, the detached job over the Ray Jobs REST API (no ``ray`` import);
* :mod:`.rest`: the small dashboard HTTP client both use; :mod:`.preflight`: the resource check.

Importing this package imports neither ``ray`` nor torch: only :mod:`.scheduler` imports ``ray``.
"""
