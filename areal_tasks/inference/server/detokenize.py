"""Text of generated tokens as they arrive, and the bytes of one token, for OpenAI streaming and log-probs.

:class:`IncrementalDetokenizer` turns a growing list of token ids into text deltas without decoding
the whole output again at every step and without splitting a multi-byte character: it decodes a
short window (the tokens of the last delta as context, then the new ones), as Hugging Face's
``TextStreamer`` and vLLM do, and holds the new text back while it ends in U+FFFD (a character whose
bytes are not all there yet). The context matters for tokenizers whose decoding of a token depends
on its neighbour (SentencePiece's leading space).

:func:`token_bytes` gives a token's own UTF-8 bytes, which for byte-level BPE may be part of a
character (OpenAI's ``bytes`` field); decoding the token alone would give U+FFFD's bytes instead.
"""

from __future__ import annotations

import functools
import logging
import re
from typing import Any

logger = logging.getLogger(__name__)

#: what a decode ends in while a character's bytes are incomplete.
REPLACEMENT = "\ufffd"
_BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")


class IncrementalDetokenizer:
    """Text deltas of one sequence's output ids (see the module doc)."""

    def __init__(self, tokenizer: Any, skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        #: start of the context window, and the end of the ids already turned into text.
        self.prefix_offset = 0
        self.read_offset = 0
        #: all the text produced so far (the concatenation of the deltas).
        self.text = ""

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def advance(self, ids: list[int]) -> str:
        """The new text of ``ids`` (the output so far, a prefix of every later call's) since the
        last call; empty while a character is incomplete."""
        if len(ids) <= self.read_offset:
            return ""
        prefix = self._decode(ids[self.prefix_offset : self.read_offset])
        full = self._decode(ids[self.prefix_offset :])
        if len(full) <= len(prefix) or full.endswith(REPLACEMENT) or not full.startswith(prefix):
            return ""
        delta = full[len(prefix) :]
        self.prefix_offset, self.read_offset = self.read_offset, len(ids)
        self.text += delta
        return delta


@functools.lru_cache(maxsize=8)
def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level BPE alphabet: the printable character that stands for each byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = list(printable)
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars)}


def _byte_level(tokenizer: Any) -> bool:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    return type(getattr(backend, "decoder", None)).__name__ == "ByteLevel"


def token_bytes(tokenizer: Any, token_id: int) -> list[int]:
    """The UTF-8 bytes token ``token_id`` stands for (see the module doc)."""
    piece = tokenizer.convert_ids_to_tokens(token_id)
    if isinstance(piece, str):
        if _byte_level(tokenizer):
            table = _byte_decoder()
            if all(ch in table for ch in piece):
                return [table[ch] for ch in piece]
        fallback = _BYTE_FALLBACK.fullmatch(piece)
        if fallback:  # SentencePiece's byte fallback
            return [int(fallback.group(1), 16)]
    return list(tokenizer.decode([token_id]).encode("utf-8"))
