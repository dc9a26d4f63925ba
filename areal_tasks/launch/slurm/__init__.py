"""The SLURM backend: worker groups as ``srun`` steps (:class:`SlurmScheduler`) and detached jobs as
``sbatch`` batch jobs (:class:`SlurmJobs`), with the live checks of :mod:`.preflight`.

Every SLURM command goes through :mod:`.commands` (``SLURM_CONF`` always set); :mod:`.script`
renders the batch script and the ``srun`` lines.
"""

from areal_tasks.launch.slurm.scheduler import SlurmScheduler

__all__ = ["SlurmScheduler"]
