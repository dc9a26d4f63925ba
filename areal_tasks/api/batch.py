"""The packed batch layout that crosses the rollout -> algorithm -> train-engine boundary.

A *packed batch* is a ``dict[str, torch.Tensor]`` holding ``B`` sequences concatenated end to end
with no padding between them (``T`` = total tokens):

==================  ==========  =====================================================================
key                 shape       meaning
==================  ==========  =====================================================================
``input_ids``       ``[T]``     token ids of all sequences, concatenated (prompt + response)
``cu_seqlens``      ``[B+1]``   int32 prefix sums of sequence lengths; sequence ``i`` is
                                ``input_ids[cu_seqlens[i]:cu_seqlens[i+1]]``
``position_ids``    ``[T]``     restart at 0 for every sequence (derived if absent)
``loss_mask``       ``[T]``     1 for tokens the policy produced and is trained on, else 0
``logprobs``        ``[T]``     behaviour log-probabilities from the inference server
``versions``        ``[T]``     policy version that produced each token (-1 for prompt tokens)
``rewards``         ``[B]``     scalar reward per sequence
``group_ids``       ``[B]``     int id shared by the samples of one prompt (GRPO group)
==================  ==========  =====================================================================

Vision-language batches add three keys (all three or none; a text-only batch has none), with the
images of every sequence in order, sequence after sequence:

==================  ============  ===================================================================
key                 shape         meaning
==================  ============  ===================================================================
``pixel_values``    ``[P, D]``    the image processor's flattened patches of every image (float32);
                                  image ``j`` has ``prod(image_grid_thw[j])`` rows
``image_grid_thw``  ``[N, 3]``    every image's (temporal, height, width) patch grid (int64)
``seq_n_images``    ``[B]``       how many of those images each sequence holds (0: text only)
==================  ============  ===================================================================

``input_ids`` carry each image's placeholder tokens already expanded (as the processor writes
them); engines derive the model's own position ids (Qwen2-VL's 3-D rotary positions) from
``input_ids``, ``image_grid_thw`` and ``cu_seqlens``. ``pixel_values`` and ``image_grid_thw`` are
neither per token nor per sequence (:func:`is_image_key`): splitting a batch keeps each sequence's
images, and their patch rows, with it.

Token alignment: every per-token tensor is aligned with ``input_ids``. A log-probability at index
``t`` is ``log p(input_ids[t] | input_ids[<t])`` of the same sequence; the first token of every
sequence has no such probability, stores ``0`` and is never in ``loss_mask``. Engines return
``logprobs``/``entropy``/``values`` in this same layout, so algorithms never shift anything.

Algorithms and engines may add keys (``advantages``, ``ref_logprobs``, ``values``, ``returns``,
``prox_logprobs``...): per-token keys have shape ``[T]``, per-sequence keys shape ``[B]``. Splitting
into micro-batches keeps whole sequences and slices both kinds accordingly.

This module is torch-free: it only names the keys.
"""

from __future__ import annotations

INPUT_IDS = "input_ids"
CU_SEQLENS = "cu_seqlens"
POSITION_IDS = "position_ids"
LOSS_MASK = "loss_mask"
LOGPROBS = "logprobs"
VERSIONS = "versions"
REWARDS = "rewards"
GROUP_IDS = "group_ids"
PIXEL_VALUES = "pixel_values"
IMAGE_GRID_THW = "image_grid_thw"
SEQ_N_IMAGES = "seq_n_images"

#: keys whose first dimension counts images (``image_grid_thw``) or their patches (``pixel_values``).
IMAGE_KEYS = frozenset({PIXEL_VALUES, IMAGE_GRID_THW})
#: the keys of a vision-language batch (present together or not at all).
VISION_KEYS = frozenset({PIXEL_VALUES, IMAGE_GRID_THW, SEQ_N_IMAGES})

#: keys whose first dimension is the number of sequences ``B`` rather than tokens ``T``.
PER_SEQUENCE_KEYS = frozenset({REWARDS, GROUP_IDS, "seq_rewards", "seqlens", "prompt_lens", "sample_ids"})


def is_per_sequence_key(key: str) -> bool:
    """Whether ``key`` holds one value per sequence (``[B]``) rather than per token (``[T]``).

    Besides the fixed names above, any key starting with ``seq_`` is per sequence.
    """
    return key in PER_SEQUENCE_KEYS or key.startswith("seq_")


def is_image_key(key: str) -> bool:
    """Whether ``key`` is indexed by image or image patch (``pixel_values``, ``image_grid_thw``),
    neither by token nor by sequence."""
    return key in IMAGE_KEYS
