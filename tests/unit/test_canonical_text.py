"""The canonical text of a call, written directly for the usual scalars, is byte for byte what
the JSON encoder writes (a lock key must never change with the path that computed it)."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from celery_redlock._celery.identity import _encode, _encode_arguments

ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))

TRICKY = [
    "",
    "plain",
    "ümlaut ☃ 𝄞",
    'quo"te',
    "back\\slash",
    "tab\tnew\nline",
    "\x00\x1f\x7f",
    "\u2028\u2029",
    "{braces}",
    " spaced ",
]
SCALARS: list[Any] = [
    *TRICKY,
    0,
    -1,
    2**70,
    True,
    False,
    None,
    1.5,
    float("inf"),
    float("nan"),
    -0.0,
]


def reference(names: list[str], arguments: dict[str, Any]) -> bytes:
    encoded = [[name, _encode(arguments[name], "t", name)] for name in names]
    return ENCODER.encode(["A", *encoded]).encode("utf-8", "surrogatepass")


@pytest.mark.parametrize("value", SCALARS, ids=repr)
def test_each_scalar_is_written_as_the_encoder_writes_it(value: Any) -> None:
    assert _encode_arguments("t", ["x"], {"x": value}) == reference(["x"], {"x": value})


def test_mixed_calls_and_no_parameters_match_the_encoder() -> None:
    rng = random.Random(7)
    pool = [*SCALARS, [1, "a"], {"k": None}, (2, 3)]
    assert _encode_arguments("t", [], {}) == reference([], {}) == b'["A"]'
    for _ in range(2000):
        names = [f"p{i}" for i in range(rng.randint(1, 4))]
        arguments = {name: rng.choice(pool) for name in names}
        assert _encode_arguments("t", names, arguments) == reference(names, arguments)


def test_a_non_ascii_parameter_name_matches_the_encoder() -> None:
    assert _encode_arguments("t", ["größe"], {"größe": 1}) == reference(["größe"], {"größe": 1})


def test_a_lone_surrogate_is_kept_not_an_error() -> None:
    """JSON carries one (``"\\ud800"``): its text is kept with ``surrogatepass`` (not
    printable, so the encoder writes it), never an error."""
    for value in ("\ud800", "\ud800x", ["\udfff"]):
        assert _encode_arguments("t", ["x"], {"x": value}) == reference(["x"], {"x": value})
