"""Hooks: one per external system, one method per remote call.

* :class:`~operators.hooks.storage.StorageHook`: storage pre-flight checks and checkpoint listing.
* :class:`~operators.hooks.cluster.ClusterHook`: submit/look up/cancel the RL job and check the
  resources an allocation needs, one implementation per scheduler kind (``get_cluster_hook``).
* :class:`~operators.hooks.mlflow.MlflowHook`: runs, metrics, checkpoint pointer models, the registry.

Importing this package imports neither ``areal_tasks`` nor mlflow: they load inside the methods.
"""

from operators.hooks.cluster import ClusterHook, LocalClusterHook, get_cluster_hook
from operators.hooks.mlflow import MlflowHook
from operators.hooks.storage import StorageHook

__all__ = ["ClusterHook", "LocalClusterHook", "MlflowHook", "StorageHook", "get_cluster_hook"]
