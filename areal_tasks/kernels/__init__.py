"""Ops any engine or the inference server may use: packed/varlen causal attention and its
transformers registration (``attention.py``, with the grouped-head flash ops of ``flash_gqa.py``),
the chunked fused LM head (``lm_head.py``, its Triton soft-max in ``lm_head_kernels.py``) and
per-token log-probs of packed sequences (``logprobs.py``).

Top level rather than under ``engine/``: the server imports ``register_attention`` from here and
must import nothing from ``engine/``. Importing this package imports no torch; its modules do.
"""
