"""Trainer: the SFT warm-start loop (``sft.py`` controller, ``sft_worker.py`` per rank), evaluation
through the embedded inference server (``evaluate.py``) and the ``make run`` demo pipeline (``demo.py``).

Importing this package is torch-free; the modules that train import torch inside their functions.
"""
