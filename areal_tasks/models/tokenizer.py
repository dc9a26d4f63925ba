"""``load_tokenizer``: a transformers tokenizer that is known to carry a chat template.

RL workflows render prompts with ``apply_chat_template``; a tokenizer without a template would
silently fall back to nothing useful, so by default its absence is an error that says how to fix
it. ``tiny`` (or ``tiny:<family>``) loads the tiny-model kit's tokenizer.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from areal_tasks.errors import ModelError

logger = logging.getLogger(__name__)


def load_tokenizer(path: str, require_chat_template: bool = True) -> Any:
    """Load the tokenizer at ``path`` (a local directory, a hub id, or ``tiny``) with ``AutoTokenizer``.

    Returns a ``transformers`` tokenizer. Raises :class:`ModelError` when nothing loadable is there,
    or when ``require_chat_template`` and the tokenizer has no chat template.
    """
    from transformers import AutoTokenizer

    source = str(path)
    if source == "tiny" or source.startswith("tiny:"):
        from areal_tasks.models.tiny.tokenizer_kit import build_tiny_tokenizer

        source = str(build_tiny_tokenizer())
    elif Path(source).expanduser().exists() and not Path(source).expanduser().is_dir():
        raise ModelError(f"{path}: expected a tokenizer (or model) directory, got a file")
    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
    except (OSError, ValueError) as exc:
        detail = str(exc).splitlines()[0] if str(exc) else "no detail"
        raise ModelError(
            f"{path}: could not load a tokenizer ({type(exc).__name__}: {detail}); "
            "pass a directory holding tokenizer.json / tokenizer_config.json (e.g. the model directory)"
        ) from exc
    if require_chat_template and not getattr(tokenizer, "chat_template", None):
        raise ModelError(
            f"{path}: the tokenizer has no chat template, which prompt rendering needs. Pass a tokenizer that "
            "has one (an instruct/chat model's), or set one: tokenizer.chat_template = '...jinja...' then "
            "tokenizer.save_pretrained(DIR), or pass require_chat_template=False for plain-text prompts"
        )
    logger.debug("loaded tokenizer from %s (%d tokens)", source, len(tokenizer))
    return tokenizer
