"""areal-tasks: asynchronous reinforcement learning for LLMs, run as a managed job.

Importing this package is cheap and torch-free; heavy subsystems (engines, inference server)
are imported only by the code paths that run them.
"""

__version__ = "0.1.0"
