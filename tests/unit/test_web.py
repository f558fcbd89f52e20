"""The dashboard's pure parts: filters turned into SCAN patterns, page cursors, credentials,
sessions, CSRF tokens, the ``Origin`` check, escaping in the SVG and in log lines."""

from __future__ import annotations

import base64
import xml.etree.ElementTree as ET

import pytest

from celery_redlock._redis.inventory import MAX_FILTER, _cursor, check_filter
from celery_redlock._redis.keys import glob_escape, lock_pattern
from celery_redlock.web._asgi import host_of
from celery_redlock.web._core import SHOWN_MAX, _name_prefix, _shown
from celery_redlock.web._security import (
    MIN_SECRET,
    SECRET_ENV,
    SESSION_LIFETIME,
    Credentials,
    Guard,
    origin_ok,
)
from celery_redlock.web._svg import COLORS, MAX_LANES, draw


def test_a_filter_is_an_escaped_literal_prefix() -> None:
    assert lock_pattern("redlock", check_filter("")) == "redlock:{*}*"
    assert lock_pattern("redlock", check_filter("proj.sync:")) == "redlock:{proj.sync:*}*"
    assert lock_pattern("redlock", check_filter("a*b?[c]\\")) == "redlock:{a\\*b\\?\\[c\\]\\\\*}*"
    assert lock_pattern("my[p]", check_filter("x")) == "my\\[p\\]:{x*}*"
    assert glob_escape("*?[]\\") == "\\*\\?\\[\\]\\\\"


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ("x" * (MAX_FILTER + 1), "at most 200"),
        ("a{b", "'{'"),
        ("a}b", "'}'"),
        ("a\nb", "printable"),
    ],
)
def test_a_bad_filter_is_refused(bad: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        check_filter(bad)


def test_the_task_filter_and_the_name_prefix_combine() -> None:
    assert _name_prefix("", "", "job") == "job"
    assert _name_prefix("proj.t", "proj.t", "") == "proj.t:"
    assert _name_prefix("proj.t", "proj.t", "proj") == "proj.t:"
    assert _name_prefix("proj.t", "proj.t", "proj.t:ab") == "proj.t:ab"
    assert _name_prefix("proj.t", "shared", "") == "shared:"  # its lock_name
    with pytest.raises(ValueError, match="excludes every lock of the task"):
        _name_prefix("proj.t", "proj.t", "other")


@pytest.mark.parametrize(
    "cursor", ["", "x:1", "1", "0:-1", "3:0", "0:" + "9" * 21, "0:\u0663", f"0:{1 << 64}"]
)
def test_a_foreign_cursor_is_refused(cursor: str) -> None:
    with pytest.raises(ValueError, match="cursor"):
        _cursor(cursor, 3)


def test_cursors_name_a_node_and_its_scan_position() -> None:
    assert _cursor("0", 1) == (0, 0)
    assert _cursor("0:0", 1) == (0, 0)
    assert _cursor("2:12345", 3) == (2, 12345)


def test_a_short_secret_in_the_environment_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SECRET_ENV, "s" * (MIN_SECRET - 1))
    with pytest.raises(ValueError, match=f"REDLOCK_WEB_SECRET must be at least {MIN_SECRET}"):
        Guard(Credentials())
    monkeypatch.setenv(SECRET_ENV, "s" * MIN_SECRET)
    assert Guard(Credentials()).secret == b"s" * MIN_SECRET
    # Read from a file, with its line break (helper probe, round 3): the same sessions.
    monkeypatch.setenv(SECRET_ENV, "s" * MIN_SECRET + "\n")
    assert Guard(Credentials()).secret == b"s" * MIN_SECRET


def test_credentials_come_from_the_environment_and_are_checked() -> None:
    assert not Credentials.from_env({}).configured
    with pytest.raises(ValueError, match="both REDLOCK_WEB_USER and REDLOCK_WEB_PASSWORD"):
        Credentials.from_env({"REDLOCK_WEB_USER": "u"})
    with pytest.raises(ValueError, match="at least 16"):
        Credentials.from_env({"REDLOCK_WEB_TOKEN": "short"})
    with pytest.raises(ValueError, match="REDLOCK_WEB_PASSWORD must be at least 12"):
        Credentials.from_env({"REDLOCK_WEB_USER": "ops", "REDLOCK_WEB_PASSWORD": "pw"})
    # Basic auth splits at the first ':': such a user could never log in (helper probe, round 3).
    with pytest.raises(ValueError, match="REDLOCK_WEB_USER cannot contain ':'"):
        Credentials.from_env({"REDLOCK_WEB_USER": "ops:admin", "REDLOCK_WEB_PASSWORD": "p" * 14})
    token, password = "t" * 20, "pw-of-twelve"
    guard = Guard(
        Credentials.from_env(
            {
                "REDLOCK_WEB_TOKEN": token,
                "REDLOCK_WEB_USER": "ops",
                "REDLOCK_WEB_PASSWORD": password,
            }
        ),
        secret=b"s" * 32,
    )
    assert guard.actor(f"Bearer {token}", None) == "token"
    assert guard.actor("Bearer " + "x" * 20, None) is None
    # A value read from a file keeps its line break, which no header can carry: dropped.
    read = Credentials.from_env(
        {
            "REDLOCK_WEB_TOKEN": token + "\n",
            "REDLOCK_WEB_USER": "ops\r\n",
            "REDLOCK_WEB_PASSWORD": password + "\n",
        }
    )
    assert (read.token, read.user, read.password) == (token, "ops", password)
    basic = base64.b64encode(b"ops:pw-of-twelve").decode()
    assert guard.actor(f"Basic {basic}", None) == "ops"
    assert guard.actor("Basic " + base64.b64encode(b"ops:no").decode(), None) is None
    assert guard.actor("Basic !!!", None) is None
    # Not ASCII (base64 refuses it with a plain ValueError: it was a 500), not UTF-8 inside.
    assert guard.actor("Basic éé", None) is None
    assert guard.actor("Basic " + base64.b64encode(b"ops:\xff").decode(), None) is None
    session = guard.login(token)
    assert session is not None and guard.actor(None, session) == "token (session)"
    assert guard.login("wrong") is None
    assert guard.actor(None, session[:-1] + "0") in (None, "token (session)")  # 1/16 collide
    assert not guard.valid_session("nonce." + "0" * 64)
    # No Authorization header carries "ä" as sent: curl sends UTF-8, servers read Latin-1.
    for odd in ("\u00e4", "\x7f", "\x01", "\u20ac"):
        with pytest.raises(ValueError, match="REDLOCK_WEB_TOKEN must be printable ASCII"):
            Credentials.from_env({"REDLOCK_WEB_TOKEN": "t" * 20 + odd})
    assert Credentials.from_env({"REDLOCK_WEB_TOKEN": "A-z_0.9~+/=!#$%&'*"}).token


@pytest.mark.parametrize("name", ["REDLOCK_WEB_TOKEN", "REDLOCK_WEB_USER", "REDLOCK_WEB_PASSWORD"])
def test_a_credential_of_whitespace_only_is_refused_naming_it(name: str) -> None:
    """A token of 20 spaces passed the length check and was a credential (probe, round 4)."""
    env = {"REDLOCK_WEB_USER": "ops", "REDLOCK_WEB_PASSWORD": "pw-of-twelve", name: " " * 20}
    with pytest.raises(ValueError, match=f"^{name} is only whitespace"):
        Credentials.from_env(env)
    with pytest.raises(ValueError, match=f"^{name} is only whitespace"):
        Credentials.from_env({**env, name: "\n\n\t \r\n"})


def test_trailing_line_breaks_are_dropped_and_count_for_no_length(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two trailing line breaks (a file an editor saved) kept one inside the token, which no
    header carries (probe, round 4); 15 characters and a line break are no 16. A trailing
    space stays: a password ending in one is typed with it."""
    token = "t" * 20
    read = Credentials.from_env(
        {
            "REDLOCK_WEB_TOKEN": token + "\n\n",
            "REDLOCK_WEB_USER": "ops\r\n\r\n",
            "REDLOCK_WEB_PASSWORD": "pw-of-twelve \n\n",
        }
    )
    assert (read.token, read.user, read.password) == (token, "ops", "pw-of-twelve ")
    with pytest.raises(ValueError, match="REDLOCK_WEB_TOKEN must be at least 16"):
        Credentials.from_env({"REDLOCK_WEB_TOKEN": "t" * 15 + "\r\n"})
    with pytest.raises(ValueError, match="REDLOCK_WEB_TOKEN cannot contain spaces"):
        Credentials.from_env({"REDLOCK_WEB_TOKEN": " " + "t" * 20})
    monkeypatch.setenv(SECRET_ENV, "s" * MIN_SECRET + "\n\n")
    assert Guard(Credentials()).secret == b"s" * MIN_SECRET
    monkeypatch.setenv(SECRET_ENV, " " * MIN_SECRET)
    with pytest.raises(ValueError, match=f"^{SECRET_ENV} is only whitespace"):
        Guard(Credentials())


def test_a_session_lasts_its_lifetime_under_its_token_only() -> None:
    now = [1_000_000.0]
    token = "t" * 20

    def guard(token: str) -> Guard:
        return Guard(Credentials(token=token), secret=b"s" * 32, clock=lambda: now[0])

    session = guard(token).login(token)
    assert session is not None and session.startswith("1000000.")
    now[0] += SESSION_LIFETIME - 1
    assert guard(token).valid_session(session)  # another process, the same secret and token
    assert not guard("u" * 20).valid_session(session)  # the token was rotated
    now[0] += 1
    assert not guard(token).valid_session(session)  # expired
    issued, nonce, mac = session.split(".")
    now[0] = 1_000_000.0
    assert not guard(token).valid_session(f"{int(issued) + 60}.{nonce}.{mac}")
    assert not guard(token).valid_session(f"{nonce}.{mac}")  # the old form: a nonce only


def test_a_csrf_token_belongs_to_one_browser_and_one_process() -> None:
    guard = Guard(Credentials(), secret=b"a" * 32)
    other = Guard(Credentials(), secret=b"b" * 32)
    cookie = guard.new_csrf_cookie()
    token = guard.csrf_token(cookie)
    assert guard.csrf_ok(cookie, token)
    assert not guard.csrf_ok(guard.new_csrf_cookie(), token)
    assert not other.csrf_ok(cookie, token)
    assert not guard.csrf_ok(None, token) and not guard.csrf_ok(cookie, None)


def test_a_foreign_origin_is_refused() -> None:
    own = "http://127.0.0.1:8077"
    assert origin_ok(None, None, own)
    assert origin_ok("http://127.0.0.1:8077", "same-origin", own)
    assert not origin_ok("http://127.0.0.1:9999", None, own)
    assert not origin_ok("null", None, own)
    assert not origin_ok(None, "cross-site", own)


def test_the_timeline_escapes_what_redis_holds() -> None:
    entries = [
        {
            "t": 1000,
            "task": "<b>t</b>",
            "id": '"><script>x</script>',
            "event": "acquired",
            "key": "redlock:{<img src=x>}",
        },
        {
            "t": 2000,
            "task": "<b>t</b>",
            "id": "2",
            "event": "skipped",
            "key": "redlock:{<img src=x>}",
            "holder": "<i>h</i>",
        },
    ]
    svg = str(draw(entries, 0, 3000))
    assert "<script>" not in svg and "<img" not in svg and "<i>" not in svg
    assert "&lt;img src=x&gt;" in svg and 'data-event="skipped"' in svg
    assert svg.count('class="bar"') == 1  # still held at the right edge
    turned = [{**e, "key": "redlock:{a\u202eb}", "task": "t\u202e"} for e in entries]
    svg = str(draw(turned, 0, 3000))
    assert "\u202e" not in svg and "a\\u202eb" in svg  # shown as the command line shows it


def test_the_timeline_draws_the_lanes_of_the_latest_events_and_says_how_many_more() -> None:
    """Helper probe, round 3: one lane per key, unbounded; a task of 20,000 keys drew a 9 MB
    SVG, 480,000 px tall, which the browser took 5.5 s to show."""
    entries = [
        {"t": 1000 + i, "task": "t", "id": str(i), "event": "skipped", "key": f"redlock:{{k{i}}}"}
        for i in range(MAX_LANES + 50)
    ]
    held = [("redlock:{k0}", "holder", 500)]  # the oldest event's key, held now: latest
    svg = str(draw(entries, 0, 300_000, held))
    assert svg.count("<line ") == MAX_LANES
    assert "50 more keys not drawn" in svg
    assert "redlock:{k0}" in svg and f"redlock:{{k{MAX_LANES + 49}}}" in svg
    assert "redlock:{k1}<" not in svg and "redlock:{k50}<" not in svg  # the oldest, not held
    assert "redlock:{k51}<" in svg


def test_every_legend_entry_is_inside_the_picture() -> None:
    """The tenth entry, ``lost``, was placed at x=969 in a 960 px wide SVG (probe, round 4)."""
    svg = ET.fromstring(str(draw([{"t": 1000, "event": "skipped", "key": "k"}], 0, 3000)))
    width, height = float(svg.get("width") or 0), float(svg.get("height") or 0)
    ns = "{http://www.w3.org/2000/svg}"
    legend = [t for t in svg.iter(f"{ns}text") if t.text in COLORS]
    assert [t.text for t in legend] == list(COLORS)
    for text in legend:
        size = float(text.get("font-size") or 0)
        # A generous width per character (0.7 em; sans-serif averages about 0.55 em).
        right = float(text.get("x") or 0) + 0.7 * size * len(text.text or "")
        assert right <= width, (text.text, right, width)
        assert 0 < float(text.get("y") or 0) <= height


def test_a_log_line_shows_posted_text_escaped_and_cut() -> None:
    assert _shown("redlock:{proj.t:ab}") == "redlock:{proj.t:ab}"
    assert _shown("a\nb\rc\x1b[31m\u2028d\u00e9") == "a\\nb\\rc\\x1b[31m\\u2028d\u00e9"
    cut = _shown("k" * 1000)
    assert cut == "k" * SHOWN_MAX + "... (1000 characters)"


@pytest.mark.parametrize(
    ("header", "host"),
    [
        ("127.0.0.1:8000", "127.0.0.1"),
        ("[::1]:8000", "::1"),
        ("[::1]", "::1"),
        ("LocalHost", "localhost"),
    ],
)
def test_the_host_of_a_host_header_has_no_port(header: str, host: str) -> None:
    assert host_of(header) == host


def test_a_release_redis_did_not_answer_ends_its_holders_bar() -> None:
    """Review, session 25: ``unreleased`` (the key freed by its TTL) was recorded in a lane of
    its own, without the key, and left the holder's bar open to the right edge."""
    entries = [
        {"t": 1000, "task": "t", "id": "1", "event": "acquired", "key": "redlock:{k}"},
        {"t": 2000, "task": "t", "id": "1", "event": "unreleased", "key": "redlock:{k}"},
    ]
    svg = ET.fromstring(str(draw(entries, 0, 10_000)))
    ns = "{http://www.w3.org/2000/svg}"
    (bar,) = [r for r in svg.iter(f"{ns}rect") if r.get("class") == "bar"]
    right = float(bar.get("x") or 0) + float(bar.get("width") or 0)
    assert right < float(svg.get("width") or 0) / 2  # ends at 2 s of 10, not at the edge
