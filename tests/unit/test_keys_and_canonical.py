"""Lock identity: the canonical encoding of a call and the key names built from it."""

from __future__ import annotations

import collections
import fnmatch
import hashlib
import inspect
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from celery import Celery
from redis.crc import key_slot

from celery_redlock import LockedTask, lock_key
from celery_redlock._celery.identity import encode_call
from celery_redlock._redis import keys as _keys
from celery_redlock.exceptions import LockConfigError

OWNER = "tests.sync_account"


def sync_account(account_id: Any, full: Any = False) -> None:
    """The task function whose calls are encoded below."""


PARAMS = list(inspect.signature(sync_account).parameters.values())


def enc(*args: Any, by: Callable[..., str] | Sequence[str] | None = None, **kwargs: Any) -> bytes:
    return encode_call(OWNER, PARAMS, args, kwargs, by)


def key_of(canonical: bytes, prefix: str = "redlock") -> str:
    return _keys.keys_for(prefix, _keys.task_lock_name(OWNER, canonical)).lock


# -- binding to the signature -------------------------------------------------------------------


def test_positional_keyword_and_order_agree() -> None:
    assert enc(1, full=2) == enc(account_id=1, full=2) == enc(full=2, account_id=1)
    assert enc(1, 2) == enc(1, full=2)


def test_defaults_are_applied() -> None:
    assert enc(1) == enc(1, full=False) == enc(account_id=1, full=False)
    assert enc(1) != enc(1, full=True)


def test_call_not_matching_the_signature_is_a_type_error_naming_the_owner() -> None:
    with pytest.raises(TypeError, match=OWNER):
        enc(1, 2, 3)
    with pytest.raises(TypeError, match=OWNER):
        enc(full=True)  # account_id missing


# -- values keep their type ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("one", "other"),
    [
        (1, "1"),
        (True, 1),
        (False, 0),
        (1.0, 1),
        (None, "null"),
        (None, 0),
        ("", None),
    ],
    ids=repr,
)
def test_values_of_different_types_differ(one: Any, other: Any) -> None:
    assert enc(one) != enc(other)


def test_zero_and_negative_zero_are_one_value() -> None:
    # -0.0 == 0.0 in Python, and JSON carries the sign to the worker: both share a key.
    assert enc(-0.0) == enc(0.0) and enc([-0.0]) == enc([0.0])
    assert enc({"a": -0.0}) == enc({"a": 0.0})
    # A mapping key reaches the worker as the string JSON made of it ("-0.0"): kept as sent.
    assert enc({-0.0: 1}) == enc({"-0.0": 1})
    assert enc(-0.0) != enc(0)  # a float is still no int


def test_tuple_and_list_are_the_same_sequence() -> None:
    # Celery's JSON serializer turns a tuple into a list: the worker must compute the same key.
    assert enc((1, 2, (3, 4))) == enc([1, 2, [3, 4]])
    assert enc([1, 2]) != enc([2, 1])


def test_dict_key_order_is_irrelevant() -> None:
    assert enc({"a": 1, "b": {"x": 1, "y": 2}}) == enc({"b": {"y": 2, "x": 1}, "a": 1})
    assert enc({"a": 1}) != enc({"a": 2})


@pytest.mark.parametrize(
    ("one", "other"),
    [
        (["L", 1], [1]),  # a list imitating the list tag
        ([["L", 1]], [[1]]),
        (["D", ["a", 1]], {"a": 1}),  # a list imitating the dict tag
        ([["a", 1]], {"a": 1}),  # a list of pairs is not a mapping
        (["T", "bytes", "61"], b"a"),  # a list imitating a tagged scalar
        ([], {}),
        ([[]], []),
        ({"a": [1]}, {"a": 1}),
    ],
    ids=repr,
)
def test_nested_containers_are_tagged(one: Any, other: Any) -> None:
    assert enc(one) != enc(other)


def test_tagged_scalars_are_stable_and_distinct() -> None:
    assert enc(b"\x00\x01") == enc(bytearray(b"\x00\x01"))
    assert enc(b"ab") != enc("ab")
    assert enc(b"ab") != enc("6162")


# -- rejected values ----------------------------------------------------------------------------


def test_argument_without_canonical_encoding_names_owner_and_parameter() -> None:
    with pytest.raises(TypeError) as info:
        enc(1, full=object())
    message = str(info.value)
    assert OWNER in message
    assert "'full'" in message
    assert "object" in message


def test_nested_unencodable_value_names_the_top_level_parameter() -> None:
    with pytest.raises(TypeError, match=rf"{OWNER}.*'account_id'"):
        enc({"nested": [1, {2, 3}]})


def test_mapping_with_unencodable_key_is_rejected() -> None:
    with pytest.raises(TypeError, match=rf"{OWNER}.*'account_id'"):
        enc({(1, 2): "tuple key"})


# -- lock_by ------------------------------------------------------------------------------------


def test_lock_by_names_select_the_identity() -> None:
    assert enc(1, full=True, by=["account_id"]) == enc(1, full=False, by=["account_id"])
    assert enc(1, by=["account_id"]) != enc(2, by=["account_id"])
    assert enc(1, by=()) == enc(2, by=())  # one lock per task name


def test_lock_by_callable_returning_str_is_the_identity() -> None:
    def by(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        return f"acct-{args[0] if args else kwargs['account_id']}"

    assert enc(7, by=by) == enc(account_id=7, full=True, by=by)
    assert enc(7, by=by) != enc(8, by=by)


@pytest.mark.parametrize("returned", [7, None, b"acct-7", ["acct", 7]], ids=repr)
def test_lock_by_callable_must_return_str(returned: Any) -> None:
    with pytest.raises(LockConfigError, match=rf"{OWNER}.*lock_by.*{type(returned).__name__}"):
        enc(7, by=lambda args, kwargs: returned)


def test_lock_by_callable_sees_containers_as_json_gives_them_back() -> None:
    """The caller has a tuple, the worker JSON's list (and string mapping keys): the callable
    sees the same in both, so both compute one key."""

    def by(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        return repr((args, kwargs))

    assert enc((1, 2), {1: (3,)}, by=by) == enc([1, 2], {"1": [3]}, by=by)
    assert enc(1, by=by) != enc(account_id=1, by=by)  # as sent: not bound to the signature


def test_lock_by_callable_sees_the_objects_themselves_under_pickle() -> None:
    """Under pickle the worker gets the caller's objects: a named tuple stays one, and a
    callable reading its fields works on both sides."""
    account = collections.namedtuple("account", ["pk", "name"])

    def by(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        return str(args[0].pk)

    pickled = encode_call(OWNER, PARAMS, (account(5, "x"),), {}, by, "pickle")
    assert pickled == encode_call(OWNER, PARAMS, (account(5, "y"),), {}, by, "pickle")
    app = Celery("pickled", set_as_current=False, task_serializer="pickle")
    app.conf.redlock_url = "redis://127.0.0.1:1/0"  # never connected to

    @app.task(base=LockedTask, lock_by=by, shared=False)
    def sync(account: Any) -> None: ...

    assert lock_key(sync, account(5, "x")) == lock_key(sync, account(5, "y"))
    app.close()


# -- keys ---------------------------------------------------------------------------------------


def test_key_length_is_fixed_and_the_argument_never_appears() -> None:
    big = "PERSONAL-DATA-" + "x" * 1_000_000
    small_key = key_of(enc("tiny"))
    big_key = key_of(enc(big))
    assert big_key != small_key
    assert len(big_key) == len(small_key) < 200
    assert "PERSONAL-DATA" not in big_key
    assert "tiny" not in small_key
    assert big_key.startswith(f"redlock:{{{OWNER}:")


def test_digest_is_32_hex_characters() -> None:
    digest = _keys.digest(enc(1))
    assert len(digest) == 32
    int(digest, 16)
    assert _keys.task_lock_name(OWNER, enc(1)) == f"{OWNER}:{digest}"


def _hash_tag(key: str) -> str:
    """The part Redis Cluster hashes: between the first '{' and the next '}'."""
    start = key.index("{")
    end = key.index("}", start + 1)
    return key[start + 1 : end]


def test_keys_of_one_lock_share_one_hash_tag() -> None:
    keys = _keys.keys_for("app", "report:2024")
    assert keys.lock == "app:{report:2024}"
    names = (keys.lock, keys.fence, keys.channel)
    assert len(set(names)) == 3
    assert {_hash_tag(k) for k in names} == {"report:2024"}
    assert all(k.count("{") == 1 and k.count("}") == 1 for k in names)
    assert len({key_slot(k.encode()) for k in names}) == 1


def test_lock_pattern_matches_lock_keys_under_the_prefix_only() -> None:
    pattern = _keys.lock_pattern("app")
    assert fnmatch.fnmatchcase(_keys.keys_for("app", "x").lock, pattern)
    assert not fnmatch.fnmatchcase(_keys.keys_for("other", "x").lock, pattern)


@pytest.mark.parametrize("name", ["a{b", "a}b", "{ab}", "", "}"], ids=repr)
def test_names_with_braces_or_empty_are_rejected(name: str) -> None:
    with pytest.raises(ValueError, match="lock name"):
        _keys.keys_for("redlock", name)


def test_a_lone_surrogate_has_its_own_key_not_an_encoding_error() -> None:
    """JSON carries ``"\\ud800"`` and the worker decodes it back: the key was a
    ``UnicodeEncodeError`` (quoting the character) in the caller and the worker alike."""
    keys = {enc("\ud800x"), enc("\ud801x"), enc("x"), enc(account_id="\ud800x", full=[1])}
    assert len(keys) == 4
    by = lambda args, kwargs: str(args[0])  # noqa: E731 - the callable identity's path
    assert enc("\ud800x", by=by) != enc("\ud801x", by=by)


@pytest.mark.parametrize("secret", [None, "s3cret", b"\x00raw bytes", "long" * 40, b"k" * 65])
def test_the_kept_hasher_gives_the_digest_of_a_fresh_blake2b(secret: str | bytes | None) -> None:
    """:func:`_keys.digest` copies a BLAKE2b state made once per secret: the same digest as
    one made for the call, keyed with :func:`_keys.secret_key` (long secrets hashed first),
    on every call, whatever was hashed before."""
    key = None if secret is None else _keys.secret_key(secret)
    for canonical in (enc(1), enc("x" * 10_000), enc(1)):
        fresh = hashlib.blake2b(canonical, digest_size=16, **({} if key is None else {"key": key}))
        assert _keys.digest(canonical, secret) == fresh.hexdigest()


@pytest.mark.parametrize("by", [None, ["b"], ["c", "a"]])
def test_a_call_bound_by_position_and_by_keyword_has_one_lock_name(by: list[str] | None) -> None:
    """The positional fast path of the lock name (the arguments in order, no dict, no
    ``lock_by`` lookup by name) names the lock as binding the call does."""
    app = Celery("positions", set_as_current=False)
    app.conf.redlock_url = "redis://127.0.0.1:1/0"  # never connected to

    @app.task(base=LockedTask, lock_by=by, shared=False)
    def three(a: int, b: str, c: list[int]) -> None: ...

    by_position = lock_key(three, 1, "two", [3])
    assert lock_key(three, 1, "two", c=[3]) == by_position
    assert lock_key(three, c=[3], b="two", a=1) == by_position
    # b is in the identity unless lock_by leaves it out.
    assert (lock_key(three, 1, "TWO", [3]) == by_position) is (by == ["c", "a"])
    app.close()
