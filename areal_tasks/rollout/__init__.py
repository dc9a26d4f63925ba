"""Rollout: the asynchronous executor with bounded staleness (``executor.py``), the workflows that
turn one dataset item into one trajectory (``workflows/``) and the reward functions (``rewards/``)."""
