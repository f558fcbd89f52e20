"""What the dashboard shows and does, whatever serves it (ASGI app, Django view).

:class:`Dashboard` reads a page of locks, the counters and the timeline, renders them with
Jinja2 (autoescaping on: every key, task id and filter is escaped), and runs the actions. The
adapters only turn a request into a call here and check who is asking.

Actions, each refused unless the dashboard was built with ``actions=True``:

* ``release`` (``key``, ``fingerprint``, ``force``): owner-checked release of one slot; it
  refuses when the slot changed holder since the page was drawn, and refuses a holder that is
  alive (its worker answers a ping, or its task renews the lock and it was renewed within two
  thirds of the lease) or whose liveness is unknown, unless ``force`` is set: the verdict of
  ``celery redlock release`` (:func:`celery_redlock.cli._liveness.verdicts`). Unforced, the
  release also refuses a lock renewed between the read and the delete (one script); forced, it
  deletes the value read whatever its TTL, as ``release --force`` does;
* ``release-dead`` (``prefix``, and ``lock_name`` when the page filtered by a task): the slots,
  among those the filter selects (names starting with ``prefix``, of that lock name), whose
  holder is dead by that verdict (each released unless renewed meanwhile);
* ``clear-marker`` / ``reset-rate`` (``key``, ``fingerprint``): delete an enqueue or
  newest-call marker, or a rate window, if it is unchanged since the page was drawn.

Each action is logged (``celery_redlock.web``, INFO: action, key, actor, outcome) and sent as
the :data:`~celery_redlock.signals.lock_admin_action` signal. What the request posted is
logged with its control characters escaped and cut to :data:`SHOWN_MAX` characters: a key
holding a newline cannot write a line of its own into the audit log. A refused request (a
read-only dashboard, an unknown action) is no action: one WARNING, no signal. Hazard of
``release-dead`` (as for ``celery redlock release --dead``): a live worker that cannot answer
a ping in time (a ``solo`` pool in a long task) looks dead, and its lock is released under it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import click
import jinja2

from .._celery import timeline
from .._celery.identity import lock_name_of
from .._celery.options import settings_for
from .._redis import companions
from .._redis.clients import redact
from .._redis.inventory import (
    MAX_FILTER,
    HeldLock,
    Inventory,
    Released,
    ReleaseUnanswered,
    check_filter,
)
from .._redis.keys import is_slot
from ..cli._format import dead_released, safe
from ..cli._liveness import (
    DEAD,
    Verdict,
    checked_wait,
    confirmed,
    hosts_to_ping,
    judged_unpinged,
    liveness,
    renewals,
    unpinged_why,
    verdict,
)
from ..exceptions import LockConfigError, LockUnavailable
from ..metrics import EVENTS, by_event, read_stats
from ..signals import lock_admin_action
from . import _svg
from ._rows import Row, rows_of

__all__ = ["ActionResult", "Dashboard"]

logger = logging.getLogger("celery_redlock.web")

#: How long a ping answer is reused for the next page views.
LIVENESS_TTL = 5.0

#: The timeline's windows, in minutes, and the ring entries a view reads at most (about
#: 20 MB): a ring of ``redlock_timeline=1000000`` would be 200 MB to read and parse per view.
TIMELINE_MINUTES = (5, 10, 30, 60)
TIMELINE_READ = 100_000

ACTIONS = ("release", "release-dead", "clear-marker", "reset-rate")

#: The characters of a posted key (or filter) a log line or a message shows at most.
SHOWN_MAX = 256

#: What a page says instead of a traceback: the lock Redis (or a node of it) does not answer
#: or refuses (:class:`~celery_redlock._redis.inventory.InventoryRefused` is one), the broker
#: does not carry the ping.
_UNREACHABLE = (LockUnavailable, click.ClickException, OSError)

_env = jinja2.Environment(
    loader=jinja2.PackageLoader("celery_redlock.web", "templates"),
    autoescape=True,
    undefined=jinja2.StrictUndefined,
)
#: Text as the command line shows it: control, bidi and other invisible characters escaped
#: (``\u202e``), so a name cannot show reversed or hide part of itself.
_env.filters["shown"] = safe


@dataclass(frozen=True)
class ActionResult:
    """What an action did: ``status`` is an HTTP status (200 done, 409 refused)."""

    status: int
    message: str


def _shown(text: str, limit: int = SHOWN_MAX) -> str:
    """``text`` as a log line or a message shows it: each unprintable character (newline,
    carriage return, escape, U+2028...) escaped as the command line shows it
    (:func:`~celery_redlock.cli._format.safe`), cut to ``limit``."""
    escaped = safe(text)
    return escaped if len(escaped) <= limit else f"{escaped[:limit]}... ({len(text)} characters)"


def _cause(exc: BaseException) -> str:
    """What a page says when Redis or the broker fails: the exceptions of the lock Redis and
    of the ping say what failed (once); a bare socket error does not."""
    if isinstance(exc, (LockUnavailable, click.ClickException)):
        return redact(exc)
    return f"cannot reach the lock Redis: {redact(exc)}"


#: The longest key the timeline looks up (compared whole, never scanned) and an action takes: a
#: lock name can be as long as a task's name. A row links its timeline up to this length.
MAX_KEY = 4096

#: What a browser never posts as it is in a form field: a line break becomes CR LF, a NUL
#: U+FFFD (the HTML standard's form encoding). A row whose key holds one offers no action
#: (its button would post another key and answer "not held"): the command line takes it.
UNPOSTABLE = frozenset("\r\n\x00")


def postable(key: str) -> bool:
    """Whether a row's form can carry ``key`` as it is (:data:`MAX_KEY`,
    :data:`UNPOSTABLE`)."""
    return len(key) <= MAX_KEY and UNPOSTABLE.isdisjoint(key)


_env.tests["postable"] = postable


def _text(value: str | None, name: str, limit: int = MAX_FILTER) -> str:
    text = (value or "").strip()
    if len(text) > limit:
        raise ValueError(f"{name} is {len(text)} characters; at most {limit}")
    return text


class Dashboard:
    """The dashboard of one Celery app's locks.

    :param actions: allow the actions (read-only when false: every action is refused).
    :param ping_timeout: seconds to wait for the workers' answers to a control ping, from 0.1
        to 3600 (:class:`ValueError` otherwise: with less, a live worker looks dead).
    """

    def __init__(self, app: Any, *, actions: bool = False, ping_timeout: float = 1.0) -> None:
        self.app = app
        self.actions = actions
        try:
            self.ping_timeout = checked_wait(ping_timeout)
        except ValueError as exc:
            raise ValueError(f"ping_timeout: {exc}") from None
        #: Whether the pages offer "Log out" (the standalone token login has it).
        self.logout = False
        self._inventory: Inventory | None = None
        self._alive: dict[str, tuple[str, float]] = {}
        self._alive_lock = threading.Lock()
        #: One control ping at a time (see :meth:`verdicts`).
        self._ping_lock = threading.Lock()
        #: The last ping's failure and when it began (monotonic), while none succeeded since.
        self._failed: tuple[str, float] | None = None
        self._config_error: str | None = None

    @property
    def inventory(self) -> Inventory:
        if self._inventory is None:
            settings = settings_for(self.app)
            self._inventory = Inventory(settings.url, settings.prefix)
        return self._inventory

    # -- liveness -----------------------------------------------------------------------------

    def verdicts(self, locks: Iterable[HeldLock], fresh: bool = False) -> dict[str, Verdict]:
        """The verdict on each lock's holder, by key, as ``celery redlock inspect`` gives it
        (a ping, then the lease's renewal), pinging only the hosts not heard in the last
        :data:`LIVENESS_TTL` seconds (an action asks ``fresh``: it never trusts an older
        answer, only one heard after it asked).

        One ping at a time: a page view waits for the ping under way and uses its answer.
        Timeline it closes: (1) a holder's worker does not answer, so no answer is reused;
        (2) 50 page views at once each ping, in the web server's threads; (3) each ping holds
        one connection of Celery's broker pool (10 by default) and waits for another: every
        ping waits forever, and so does every later page. A ping that failed (the broker does
        not answer) is reused likewise: each view waiting behind it would fail it again.

        :raises click.ClickException: the ping failed (now or within :data:`LIVENESS_TTL`).
        """
        locks = list(locks)
        renewed = renewals(self.app, locks)
        hosts = hosts_to_ping(locks)
        asked = time.monotonic()
        since = asked if fresh else asked - LIVENESS_TTL
        known = self._heard(hosts, since)
        if hosts - known.keys():
            with self._ping_lock:
                # A ping that ended while this view waited may have heard them, or failed.
                if self._failed is not None and self._failed[1] >= since:
                    raise click.ClickException(self._failed[0])
                known = self._heard(hosts, since)
                ask = hosts - known.keys()
                if ask:
                    now = time.monotonic()
                    try:
                        heard = liveness(self.app, ask, self.ping_timeout)
                    except click.ClickException as exc:
                        # Dated when it failed: a frozen broker fails at the socket timeout
                        # (5 s), and dated from the start it was too old to be reused.
                        self._failed = (exc.message, time.monotonic())
                        raise
                    self._failed = None
                    with self._alive_lock:
                        self._alive.update({h: (state, now) for h, state in heard.items()})
                    known.update(heard)
        sure = confirmed(self.app, locks, known, self.ping_timeout)
        asked_again = {h: said for h, said in sure.items() if said is not known.get(h)}
        if asked_again:  # reused as the first answers are
            now = time.monotonic()
            with self._alive_lock:
                self._alive.update({h: (said, now) for h, said in asked_again.items()})
        lease = settings_for(self.app).lease
        return {
            lock.key: verdict(lock, sure, self.ping_timeout, lease, renewed[lock.key])
            for lock in locks
        }

    def _heard(self, hosts: set[str], since: float) -> dict[str, str]:
        """What the pings since ``since`` (monotonic) said of ``hosts``."""
        with self._alive_lock:
            return {
                h: state for h, (state, at) in self._alive.items() if h in hosts and at >= since
            }

    # -- pages --------------------------------------------------------------------------------

    def render(self, template: str, **context: Any) -> str:
        """``template`` with ``context`` (``form``: hidden CSRF fields; ``base``: the mount
        path; ``tab``; ``actions``: whether to offer the action buttons, by default whether
        the dashboard allows actions)."""
        context.setdefault("tab", "")
        context.setdefault("actions", self.actions)
        return _env.get_template(template).render(logout=self.logout, **context)

    def locks_page(
        self,
        query: Mapping[str, str],
        form: dict[str, str],
        base: str = "",
        *,
        may_act: bool = True,
    ) -> tuple[int, str]:
        """The locks page for ``query`` (``task``, ``prefix``, ``cursor``); ``form`` holds the
        hidden fields every action form carries (the CSRF token). ``may_act`` false (a mount's
        user who may not act) shows the page read-only: no button that would be refused."""
        error = None
        status = 200
        task = prefix = lock_name = ""
        # What the filter selects; None when it is refused (the page then offers no
        # release-dead, which would act on every lock).
        name_prefix: str | None = None
        tasks: list[str] = []
        rows: list[Row] = []
        next_cursor = None
        first_page = True
        alive: dict[str, str] = {}
        unanswered: dict[str, str] = {}
        try:
            tasks = self.task_names()
            task = _text(query.get("task"), "the task filter")
            prefix = _text(query.get("prefix"), "the name prefix")
            cursor = query.get("cursor") or "0"
            first_page = cursor == "0"
            lock_name = lock_name_of(self.app, task) if task else ""
            selected = _name_prefix(task, lock_name, prefix)
            view = self.inventory.view(cursor, name_prefix=selected, lock_name=lock_name)
            rows, next_cursor = rows_of(view), None if view.cursor == "0" else view.cursor
            unanswered = view.unanswered
            name_prefix = selected
            held = [lock for lock in view.locks if lock.holder]
            try:
                alive = {key: v.state for key, v in self.verdicts(held).items()}
            except click.ClickException as exc:  # the broker: the locks are shown all the same
                lease = settings_for(self.app).lease
                unpinged = judged_unpinged(self.app, held, lease, unpinged_why(self.app))
                alive = {key: v.state for key, v in unpinged.items()}
                error = f"{exc.message}: liveness is judged by renewal alone"
        except ValueError as exc:  # a LockConfigError too: the app's settings or task options
            status, error = 400, str(exc)
        except _UNREACHABLE as exc:
            status, error = 503, _cause(exc)
        now_ms = int(time.time() * 1000)
        body = self.render(
            "locks.html",
            tab="locks",
            actions=self.actions and may_act,
            rows=rows,
            alive={r.key: alive.get(r.key, "-") for r in rows},
            age={r.key: _age(now_ms, r.acquired_ms) for r in rows},
            task=task,
            prefix=prefix,
            name_prefix=name_prefix,
            lock_name=lock_name,
            next_cursor=next_cursor,
            first_page=first_page,
            error=error,
            unanswered=unanswered,
            quorum=bool(unanswered) and self.inventory.quorum > 1,
            form=form,
            base=base,
            tasks=tasks,
            max_filter=MAX_FILTER,
            max_key=MAX_KEY,
        )
        return status, body

    def task_names(self) -> list[str]:
        """The app's task names (for the filter's suggestions).

        :raises LockConfigError: on every call once a task's lock options were found invalid.
            Celery says it once only: (1) the first ``app.tasks`` finalizes the app, builds
            each task, and the one with an invalid option raises; (2) every later
            ``app.tasks`` returns the tasks without it, as if nothing were wrong. The first
            error is kept, so each page names it.
        """
        if self._config_error is not None:
            raise LockConfigError(self._config_error)
        try:
            names = list(self.app.tasks)
        except LockConfigError as exc:
            self._config_error = str(exc)
            raise
        # Only the tasks a filter can select (check_filter, on the name and on the prefix it
        # selects): a name with U+202E, or a lock_name of 200 characters, was suggested, and
        # choosing it was refused.
        return sorted(
            name
            for name in names
            if not name.startswith("celery.")
            and _filterable(name)
            and _filterable(lock_name_of(self.app, name) + ":")
        )

    def stats_page(
        self, form: dict[str, str], base: str = "", *, may_act: bool = True
    ) -> tuple[int, str]:
        context = {"form": form, "base": base, "actions": self.actions and may_act}
        try:
            counts = read_stats(self.app)
        except (LockConfigError, *_UNREACHABLE) as exc:  # the app's settings; no answer
            config = isinstance(exc, LockConfigError)
            status, message = (400, str(exc)) if config else (503, _cause(exc))
            return status, self.render("result.html", status=status, message=message, **context)
        table = {t: list(c.values()) for t, c in by_event(counts).items()}
        return 200, self.render("stats.html", tab="stats", events=EVENTS, table=table, **context)

    def timeline_page(
        self,
        query: Mapping[str, str],
        form: dict[str, str],
        base: str = "",
        *,
        may_act: bool = True,
    ) -> tuple[int, str]:
        error = None
        status = 200
        svg = None
        task = key = ""
        tasks: list[str] = []
        minutes = 10
        size = 0
        try:
            tasks = self.task_names()
            size = timeline.size_for(self.app)
            task = _text(query.get("task"), "the task")
            key = _text(query.get("key"), "the key", MAX_KEY)
            raw = query.get("minutes") or "10"
            if raw not in [str(choice) for choice in TIMELINE_MINUTES]:
                raise ValueError(f"minutes must be one of {', '.join(map(str, TIMELINE_MINUTES))}")
            minutes = int(raw)
            if size and (task or key):
                svg = self.timeline_svg(task, key, minutes)
        except ValueError as exc:  # a LockConfigError too
            status, error = 400, str(exc)
        except _UNREACHABLE as exc:
            status, error = 503, _cause(exc)
        body = self.render(
            "timeline.html",
            tab="timeline",
            actions=self.actions and may_act,
            svg=svg,
            task=task,
            key=key,
            minutes=minutes,
            choices=TIMELINE_MINUTES,
            ring=size,
            error=error,
            form=form,
            base=base,
            tasks=tasks,
        )
        return status, body

    def timeline_svg(self, task: str, key: str, minutes: int) -> Any:
        """The SVG of the ring's events of ``task`` (a task name) or ``key`` (a lock key).

        A release mark the dashboard wrote names the lock's name (the task's ``lock_name``
        when it sets one): it is drawn with the task's own events on its keys, where it ends
        the holder's bar.

        The ring is read back to the window's start, however many entries that is (up to
        ``redlock_timeline``, and :data:`TIMELINE_READ`), and the locks held now are read from
        Redis: a holder that took its lock before the window is a bar from the left edge,
        even once its ``acquired`` is older than what was read, and one whose lock is not held
        now ends there (:func:`~celery_redlock.web._svg.draw`). Timeline without the locks:
        (1) a task takes its lock and runs for an hour; (2) the 5-minute view reads the ring
        from 5 minutes ago; (3) it holds no event of that holder, and draws nothing for a lock
        held all along.
        """
        end = int(time.time() * 1000)
        start = end - minutes * 60_000
        size = min(timeline.size_for(self.app), TIMELINE_READ)
        entries = [
            e for e in timeline.read(self.app, size, start) if not key or e.get("key") == key
        ]
        marks = lock_name_of(self.app, task) if task else ""
        if task:
            keys = {e.get("key") for e in entries if e.get("task") == task}
            entries = [
                e
                for e in entries
                if e.get("task") == task or (e.get("task") == marks and e.get("key") in keys)
            ]
        return _svg.draw(entries, start, end, self._holders(key, marks))

    def _holders(self, key: str, lock_name: str) -> list[tuple[str, str, int]] | None:
        """``(key, task id, acquired ms)`` of the locks held now: ``key`` (one read), or the
        locks of ``lock_name`` (a task's); ``None`` when no filter can select them."""
        if key:
            locks = [lock for lock in (self.inventory.read(key),) if lock is not None]
        elif _filterable(lock_name):
            locks = self.inventory.of_lock_name(lock_name)
        else:
            return None
        return [
            (lock.key, lock.holder.task_id, lock.holder.acquired_ms)
            for lock in locks
            if lock.holder is not None and not lock.holder.cooling
        ]

    # -- actions ------------------------------------------------------------------------------

    def act(self, action: str, form: Mapping[str, str], actor: str) -> ActionResult:
        """Run ``action`` for ``actor`` (already authenticated, CSRF already checked).

        Refused on a read-only dashboard (403) and for an unknown action (400): nothing is
        read, no signal is sent, and the refusal is logged as a WARNING.
        """
        posted = form.get("key") or ""
        key = posted[:MAX_KEY]
        forced = form.get("force") in ("1", "on", "true")
        target, who = _shown(key or form.get("prefix") or "-"), _shown(actor)
        refused = self._refusal(action)
        if refused is not None:
            logger.warning(
                "dashboard: refused action %s %s by %s: %s",
                _shown(action),
                target,
                who,
                _shown(refused.message),
            )
            return refused
        try:
            if len(posted) > MAX_KEY:
                raise ValueError(f"the key is {len(posted)} characters; at most {MAX_KEY}")
            done = self._act(action, key, form, forced)
        except ValueError as exc:
            done = ActionResult(400, f"refused: {exc}")
        except Exception as exc:  # Redis or the broker: say so, change nothing more
            grant = companions.acl_refusal(exc, _SCRIPTS.get(action, "release_unrenewed"))
            if grant is not None:  # an answer, not an outage: name what to grant
                done = ActionResult(
                    403,
                    f"refused by the lock Redis: its ACL user may not do this; it needs {grant}",
                )
            else:
                # A release that got no answer may have happened: "unknown", not "failed".
                said = "unknown" if isinstance(exc, ReleaseUnanswered) else "failed"
                logger.warning(
                    "dashboard: %s of %s %s: %s", action, target, said, _shown(redact(exc))
                )
                done = ActionResult(503, f"{said}: {redact(exc)}")
        # The outcome names the posted key, and a holder read from Redis: both escaped.
        result = ActionResult(done.status, _shown(done.message, 2 * SHOWN_MAX))
        logger.info(
            "dashboard: %s %s by %s%s: %s",
            action,
            target,
            who,
            " (forced)" if forced else "",
            result.message,
        )
        try:
            lock_admin_action.send(
                sender=self.app,
                action=action,
                key=key or None,
                actor=actor,
                outcome=result.message,
                forced=forced,
            )
        except Exception:
            logger.exception("dashboard: a lock_admin_action receiver failed")
        return result

    def _refusal(self, action: str) -> ActionResult | None:
        """Why ``action`` is refused before anything is read, or ``None``."""
        if not self.actions:
            return ActionResult(403, "refused: the dashboard is read-only (actions disabled)")
        if action not in ACTIONS:
            return ActionResult(400, f"unknown action {action!r}; expected one of {ACTIONS}")
        return None

    def _act(self, action: str, key: str, form: Mapping[str, str], forced: bool) -> ActionResult:
        inv = self.inventory
        fingerprint = (form.get("fingerprint") or "")[:64]
        if action == "release-dead":
            return self._release_dead(
                _text(form.get("prefix"), "the name prefix"),
                _text(form.get("lock_name"), "the lock name"),
            )
        if not key.strip():  # else "not released:  is not held", a 409 about no lock at all
            raise ValueError(f"the form field 'key' is missing or empty: {action} needs a key")
        if action in ("clear-marker", "reset-rate"):
            if inv.clear_marker(key, fingerprint):
                return ActionResult(200, f"cleared {key}")
            return ActionResult(409, f"not cleared: {key} changed or is gone since it was shown")
        if not is_slot(key):
            raise ValueError(f"{key!r} is not the key of a held lock")
        lock = inv.read(key)
        if lock is None or lock.key != key:
            return ActionResult(409, f"not released: {key} is not held")
        if lock.fingerprint != fingerprint:
            return ActionResult(
                409, f"not released: {key} changed holder since the page was drawn; reload"
            )
        try:
            said = self.verdicts([lock], fresh=True)[key]
        except click.ClickException:  # the broker: a forced release needs no ping
            if not forced:
                raise
            lease, why = settings_for(self.app).lease, unpinged_why(self.app)
            said = judged_unpinged(self.app, [lock], lease, why)[key]
        if said.state != DEAD and not forced:
            holder = lock.holder.host if lock.holder else "a value that is not a token"
            return ActionResult(
                409, f"refused: {key} is held by {holder}: {said.reason}; use force"
            )
        outcome = inv.release(lock, unless_renewed=not forced)
        if outcome is Released.RELEASED:
            self._released(lock)
            return ActionResult(200, f"released {key} (holder {said.state})")
        return ActionResult(409, f"not released: {key} {_NOT_RELEASED[outcome]}")

    def _release_dead(self, prefix: str, lock_name: str) -> ActionResult:
        """Release-dead of the slots the page listed: names starting with ``prefix``, of the
        lock name ``lock_name`` when the page filtered by a task (the task ``a``'s page lists
        ``a:<digest>``, not the task ``a:b``'s ``a:b:<digest>``, which the prefix ``a:``
        matches too)."""
        locks = self.inventory.all(
            lambda lock: lock.lock_name == (lock_name or lock.lock_name),
            name_prefix=check_filter(prefix),
        )
        judged = self.verdicts(locks, fresh=True)
        released = kept = gone = 0
        for lock in locks:
            if judged[lock.key].state != DEAD:
                kept += 1
                continue
            try:
                outcome = self.inventory.release(lock, unless_renewed=True)
            except ReleaseUnanswered as exc:
                raise ReleaseUnanswered(
                    f"{dead_released('released', released, kept, gone)}; then {exc}",
                    key=exc.key,
                    nodes=exc.nodes,
                ) from exc
            if outcome is Released.RELEASED:
                self._released(lock)
                released += 1
            else:
                kept += outcome is Released.RENEWED
                gone += outcome is not Released.RENEWED
        return ActionResult(200, dead_released("released", released, kept, gone))

    def _released(self, lock: HeldLock) -> None:
        """A ``released`` mark on the timeline (if the app keeps one): it ends the holder's
        bar, which the holder, dead or forced out, will never end."""
        task_id = lock.holder.task_id if lock.holder else ""
        fields = {"key": lock.key, "by": "dashboard"}
        timeline.record_for(self.app, lock.lock_name, task_id, "released", fields)


#: The script each action runs (what an ACL refusal of it names); the releases run
#: ``release_unrenewed``.
_SCRIPTS = {"clear-marker": "clear_marker", "reset-rate": "clear_marker"}

#: Why an owner-checked release deleted nothing.
_NOT_RELEASED = {
    Released.CHANGED: "expired or changed owner meanwhile",
    Released.RENEWED: "was renewed by its holder since it was read: the holder is alive",
}


def _filterable(text: str) -> bool:
    """Whether ``text`` passes :func:`check_filter` (printable, no braces, not too long)."""
    try:
        check_filter(text)
    except ValueError:
        return False
    return True


def _name_prefix(task: str, lock_name: str, prefix: str) -> str:
    """The name prefix the filters select: a task's names start with ``<lock_name>:``, its
    ``lock_name`` or else its own name (tasks sharing a ``lock_name`` share their locks)."""
    if not task:
        return prefix
    head = lock_name + ":"
    try:
        check_filter(head)
    except ValueError as exc:
        raise ValueError(
            f"no filter can select the locks of the task '{_shown(task, 64)}', under the name "
            f"'{_shown(head, 64)}': {exc}; filter by a name prefix of it"
        ) from None
    if not prefix or head.startswith(prefix):
        return head
    if prefix.startswith(head):
        return prefix
    raise ValueError(f"the name prefix {prefix!r} excludes every lock of the task {task!r}")


def _age(now_ms: int, acquired_ms: int | None) -> str:
    if acquired_ms is None:
        return "-"
    seconds = max(now_ms - acquired_ms, 0) / 1000
    return f"{seconds:.1f}s" if seconds < 120 else f"{seconds / 60:.1f}min"
