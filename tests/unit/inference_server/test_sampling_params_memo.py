"""``SamplingParams.from_dict`` remembers settings it parsed, by their wire form with its types: the
same settings give the same (frozen) instance, and nothing parsing would tell apart is confused
(``1``, ``1.0`` and ``true`` are equal in Python; only two of them are numbers on the wire)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from areal_tasks.errors import InferenceRequestError
from areal_tasks.inference.server import sampling
from areal_tasks.inference.server.sampling import PARSED_MEMO_SIZE, SamplingParams


@pytest.fixture(autouse=True)
def empty_memo() -> Iterator[None]:
    sampling._PARSED.clear()
    yield
    sampling._PARSED.clear()


def test_the_same_settings_give_the_same_instance() -> None:
    raw = {"max_new_tokens": 8, "temperature": 0.7, "stop_token_ids": [3, 5], "stop": ["\n"]}
    first = SamplingParams.from_dict(raw)
    again = SamplingParams.from_dict(dict(raw))
    assert again is first
    assert first.stop_token_ids == frozenset({3, 5}) and first.stop == ("\n",)


@pytest.mark.parametrize(
    "accepted, refused",
    [
        ({"n": 1}, {"n": True}),
        ({"max_new_tokens": 1}, {"max_new_tokens": True}),
        ({"stop_token_ids": [1]}, {"stop_token_ids": [True]}),
        ({"ignore_eos": False}, {"ignore_eos": 0}),
        ({"stop": ["a"]}, {"stop": [["a"]]}),
    ],
)
def test_a_value_equal_in_python_but_not_on_the_wire_is_parsed_again(accepted, refused) -> None:
    SamplingParams.from_dict(accepted)
    with pytest.raises(InferenceRequestError):
        SamplingParams.from_dict(refused)


def test_numbers_of_either_type_parse_to_the_same_values() -> None:
    as_int = SamplingParams.from_dict({"temperature": 1})
    as_float = SamplingParams.from_dict({"temperature": 1.0})
    assert as_int is not as_float and as_int == as_float


def test_refusals_are_never_remembered() -> None:
    for _ in range(2):
        with pytest.raises(InferenceRequestError, match="top_p"):
            SamplingParams.from_dict({"top_p": 0.0})
    assert sampling._PARSED == {}


def test_unhashable_settings_are_parsed_every_time() -> None:
    raw = {"max_new_tokens": 2, "logit_bias": {}}  # an object as a value: no key
    assert SamplingParams.from_dict(raw) == SamplingParams.from_dict(raw)
    assert sampling._PARSED == {}
    assert SamplingParams.from_dict(None) == SamplingParams()


def test_the_memo_is_bounded() -> None:
    for tokens in range(PARSED_MEMO_SIZE + 10):
        assert SamplingParams.from_dict({"max_new_tokens": tokens}).max_new_tokens == tokens
    assert len(sampling._PARSED) <= PARSED_MEMO_SIZE
