"""A deterministic synthetic corpus for training the tiny tokenizer.

It mixes the kinds of text the demo and tests feed the tiny models: English-like sentences,
arithmetic (``12 + 7 = 19``), punctuation and ChatML chat turns (including tool calls), so the
learned merges cover them. Same ``seed`` -> same text, byte for byte, on every machine.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

_WORDS = [
    "the",
    "a",
    "an",
    "of",
    "to",
    "and",
    "in",
    "is",
    "it",
    "that",
    "for",
    "on",
    "with",
    "as",
    "was",
    "be",
    "by",
    "this",
    "are",
    "or",
    "at",
    "from",
    "his",
    "her",
    "they",
    "you",
    "we",
    "not",
    "have",
    "has",
    "had",
    "but",
    "what",
    "all",
    "were",
    "when",
    "there",
    "can",
    "will",
    "one",
    "which",
    "their",
    "said",
    "if",
    "do",
    "about",
    "each",
    "how",
    "up",
    "out",
    "them",
    "then",
    "she",
    "many",
    "some",
    "so",
    "these",
    "would",
    "other",
    "into",
    "more",
    "write",
    "go",
    "see",
    "number",
    "no",
    "way",
    "could",
    "people",
    "my",
    "than",
    "first",
    "water",
    "been",
    "call",
    "who",
    "find",
    "long",
    "down",
    "day",
    "did",
    "get",
    "come",
    "made",
    "may",
    "part",
    "answer",
    "question",
    "problem",
    "solve",
    "step",
    "think",
    "result",
    "total",
    "sum",
    "add",
    "subtract",
    "multiply",
    "divide",
    "equal",
    "count",
    "apple",
    "apples",
    "book",
    "books",
    "cat",
    "dog",
    "tree",
    "house",
    "car",
    "road",
    "city",
    "river",
    "small",
    "large",
    "red",
    "blue",
    "green",
    "quick",
    "brown",
    "lazy",
    "jumps",
    "over",
    "under",
    "because",
    "therefore",
    "first",
    "second",
    "third",
    "final",
    "please",
    "thanks",
    "hello",
    "user",
    "assistant",
    "system",
    "tool",
    "function",
    "weather",
    "search",
    "calculator",
    "time",
    "today",
    "value",
    "list",
    "name",
    "true",
    "false",
]
_SYLLABLES = ("ka", "lo", "mi", "ren", "tor", "sa", "vel", "qu", "ish", "ent", "ing", "ed", "er", "ly", "tion")
_PUNCT = (".", ",", "!", "?", ";", ":")
_SYSTEM = ("You are a helpful assistant.", "You are a careful math tutor.", "Answer briefly.")


def _word(rng: random.Random) -> str:
    if rng.random() < 0.85:
        return rng.choice(_WORDS)
    return "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 3)))


def _sentence(rng: random.Random) -> str:
    words = [_word(rng) for _ in range(rng.randint(4, 14))]
    words[0] = words[0].capitalize()
    text = " ".join(words)
    if rng.random() < 0.3:
        cut = rng.randint(1, len(words) - 1)
        text = " ".join(words[:cut]) + ", " + " ".join(words[cut:])
    return text + rng.choice(_PUNCT)


def _arithmetic(rng: random.Random) -> str:
    a, b = rng.randint(0, 999), rng.randint(0, 999)
    op = rng.choice("+-*")
    value = a + b if op == "+" else a - b if op == "-" else a * b
    return f"{a} {op} {b} = {value}"


def _chat(rng: random.Random) -> str:
    turns = [f"<|im_start|>system\n{rng.choice(_SYSTEM)}<|im_end|>"]
    question = _arithmetic(rng).split(" = ")[0]
    turns.append(f"<|im_start|>user\nWhat is {question}?<|im_end|>")
    if rng.random() < 0.3:
        call = '{"name": "calculator", "arguments": {"expression": "' + question + '"}}'
        turns.append(f"<|im_start|>assistant\n<tool_call>\n{call}\n</tool_call><|im_end|>")
        turns.append(f"<|im_start|>tool\n{_arithmetic(rng)}<|im_end|>")
    turns.append(f"<|im_start|>assistant\n<think>\n{_sentence(rng)}\n</think>\n{_sentence(rng)}<|im_end|>")
    return "\n".join(turns)


def synthetic_corpus(seed: int = 0, num_documents: int = 4000) -> Iterator[str]:
    """Yield ``num_documents`` short documents, deterministically for a given ``seed``."""
    rng = random.Random(seed)
    makers = (_sentence, _arithmetic, _chat)
    for _ in range(num_documents):
        maker = rng.choices(makers, weights=(5, 3, 2))[0]
        yield maker(rng)
