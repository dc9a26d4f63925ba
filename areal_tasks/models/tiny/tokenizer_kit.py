"""The tiny tokenizer: a byte-level BPE trained locally on the synthetic corpus, with a chat template.

Digits are split one per token before BPE (``Digits(individual_digits=True)``), so numbers are
sequences of digit tokens and arithmetic stays learnable by tiny models. Special tokens take the
first ids (``<|endoftext|>`` 0, ``<|im_start|>`` 1, ``<|im_end|>`` 2); ``<tool_call>``,
``</tool_call>``, ``<think>`` and ``</think>`` are ordinary added tokens at the end. eos is
``<|im_end|>`` (end of an assistant turn), pad and bos are ``<|endoftext|>``. The vocabulary has
exactly :data:`TINY_VOCAB_SIZE` entries. Trained once per kit version and cached; every tiny model
family shares it.
"""

from __future__ import annotations

import logging
from importlib import metadata, resources
from pathlib import Path
from typing import Any

from areal_tasks.errors import ModelError
from areal_tasks.models.tiny.cache import cache_root, content_hash, get_or_build
from areal_tasks.models.tiny.corpus import synthetic_corpus

logger = logging.getLogger(__name__)

TOKENIZER_KIT_VERSION = 1
TINY_VOCAB_SIZE = 1024
ENDOFTEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS: tuple[str, ...] = (ENDOFTEXT, IM_START, IM_END)
EXTRA_TOKENS: tuple[str, ...] = ("<tool_call>", "</tool_call>", "<think>", "</think>")
#: token ids fixed by construction (checked after training)
SPECIAL_IDS: dict[str, int] = {ENDOFTEXT: 0, IM_START: 1, IM_END: 2}
BOS_ID, EOS_ID, PAD_ID = SPECIAL_IDS[ENDOFTEXT], SPECIAL_IDS[IM_END], SPECIAL_IDS[ENDOFTEXT]
_CORPUS_SEED = 1234


def chat_template() -> str:
    """The ChatML jinja chat template shipped with the kit."""
    return resources.files("areal_tasks.models.tiny").joinpath("chat_template.jinja").read_text("utf-8")


def _train_backend_tokenizer() -> Any:
    """Train the byte-level BPE ``tokenizers.Tokenizer`` (deterministic for a given kit version)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from tokenizers.trainers import BpeTrainer

    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = BpeTrainer(
        vocab_size=TINY_VOCAB_SIZE - len(EXTRA_TOKENS),
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(synthetic_corpus(_CORPUS_SEED), trainer=trainer)
    tokenizer.add_tokens([AddedToken(token, special=False, normalized=False) for token in EXTRA_TOKENS])
    if tokenizer.get_vocab_size() != TINY_VOCAB_SIZE:
        raise ModelError(
            f"tiny tokenizer training produced {tokenizer.get_vocab_size()} tokens, expected {TINY_VOCAB_SIZE}; "
            "the synthetic corpus is too small for the requested vocabulary (raise num_documents)"
        )
    for token, expected in SPECIAL_IDS.items():
        if tokenizer.token_to_id(token) != expected:
            raise ModelError(f"tiny tokenizer: {token} got id {tokenizer.token_to_id(token)}, expected {expected}")
    return tokenizer


def _write_tokenizer(directory: Path) -> None:
    from transformers import PreTrainedTokenizerFast

    logger.info("training the tiny tokenizer (%d tokens) into %s", TINY_VOCAB_SIZE, directory)
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=_train_backend_tokenizer(),
        bos_token=ENDOFTEXT,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        model_max_length=2048,
        clean_up_tokenization_spaces=False,
    )
    wrapped.chat_template = chat_template()
    wrapped.save_pretrained(str(directory))


def tokenizer_cache_key() -> str:
    """Cache entry name of the tiny tokenizer (changes with the kit, the template and ``tokenizers``)."""
    payload = {
        "kit": TOKENIZER_KIT_VERSION,
        "vocab": TINY_VOCAB_SIZE,
        "template": chat_template(),
        "tokenizers": metadata.version("tokenizers"),
    }
    return f"tokenizer-{content_hash(payload)}"


def build_tiny_tokenizer(cache_dir: str | Path | None = None) -> Path:
    """Directory holding the tiny tokenizer files (trained on first use, then reused from the cache)."""
    return get_or_build(cache_root(cache_dir), tokenizer_cache_key(), _write_tokenizer)
