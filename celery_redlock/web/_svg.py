"""The timeline picture: one lane per lock key, holders as bars, other events as marks.

Drawn from entries of the ring (:mod:`celery_redlock._celery.timeline`): a bar runs from a
task's ``acquired`` to its ``released``, ``unreleased`` or ``lost`` (or to the right edge while
it still holds); ``skipped``, ``waited``, ``retried``, ``rate_limited``, ``failed``,
``superseded``, ``expired``, ``lost``, ``released`` and ``unreleased`` are marks with a
tooltip. Every text from Redis (keys,
task names, task ids) is escaped: a lock name is chosen by whoever calls ``Lock(name)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from markupsafe import Markup, escape

from ..cli._format import safe

__all__ = ["COLORS", "draw"]

#: Fill colour per event (the legend is drawn from this table).
COLORS = {
    "acquired": "#2f7d32",
    "released": "#1565c0",
    "unreleased": "#64b5f6",
    "skipped": "#ef6c00",
    "waited": "#8e24aa",
    "retried": "#f9a825",
    "rate_limited": "#6d4c41",
    "failed": "#c62828",
    "superseded": "#546e7a",
    "expired": "#90a4ae",
    "lost": "#000000",
}

WIDTH, LANE, LEFT, TOP = 960, 24, 260, 34

#: The legend's font size and a generous width of one of its characters (sans-serif at 11 px
#: averages about 6 px): a fixed 105 px per entry put the tenth, ``lost``, at x=969, outside
#: the 960 px picture, where a browser clips it.
LEGEND_FONT, LEGEND_CHAR = 11, 8

#: Lanes drawn at most: those whose last event is latest (a lock held now counts as now). A
#: task of 20,000 keys drew a 480,000 px tall SVG of 9 MB, which a browser took 5 s to show.
MAX_LANES = 200


def draw(
    entries: Sequence[dict[str, Any]],
    start_ms: int,
    end_ms: int,
    holders: Sequence[tuple[str, str, int]] | None = None,
) -> Markup:
    """The SVG of the ``entries`` (oldest first) between ``start_ms`` and ``end_ms``.

    Entries from before ``start_ms`` only open and close bars: a holder that took its lock
    before the window and released it inside the window is a bar from the left edge. So is a
    ``released`` or ``lost`` whose ``acquired`` is not among the entries (older than what was
    read, or pushed out of the ring). ``holders``: ``(key, task id, acquired ms)`` of the locks
    held now, read from the locks themselves (``None``: not known). Each is drawn to the right
    edge, whether or not the ring still has its ``acquired``; a holder the ring says took a
    lock and never gave it back, and that ``holders`` does not list (its worker died, and its
    key expired, which writes no event), is not drawn to "now": from before the window, not at
    all; from inside it, to the lane's last event after it, or as a sliver.
    """
    span = max(end_ms - start_ms, 1)

    def x(t: int) -> float:
        return LEFT + (WIDTH - LEFT - 10) * (min(max(t, start_ms), end_ms) - start_ms) / span

    holding: dict[tuple[str, str], int] = {}
    last: dict[str, int] = {}  # the time of each lane's last event
    shapes: list[tuple[str, float, float, dict[str, Any]]] = []  # (lane, x1, x2 or -1: a mark, e)
    for e in entries:
        lane = _lane(e)
        event, t, task_id = str(e.get("event")), int(e["t"]), str(e.get("id", ""))
        last[lane] = t
        if event == "acquired":
            holding[lane, task_id] = t
            continue
        if event in ("released", "unreleased", "lost"):
            since = holding.pop((lane, task_id), start_ms)
            if t >= start_ms:
                shapes.append((lane, x(since), x(t), e))
        if t >= start_ms:
            shapes.append((lane, x(t), -1, e))
    live = None if holders is None else {(key, task_id) for key, task_id, _ in holders}
    for key, task_id, acquired_ms in holders or ():
        holding.setdefault((key, task_id), acquired_ms)
    latest = dict(last)  # each lane's latest time: a lock held now is latest
    for (lane, task_id), t in holding.items():  # still held at the right edge
        until = end_ms
        if live is not None and (lane, task_id) not in live:  # not held now
            until = last.get(lane, t)
            if until < start_ms:
                continue
        else:
            latest[lane] = end_ms
        shapes.append((lane, x(t), x(until), {"id": task_id, "event": "held"}))
    order = list(dict.fromkeys(lane for lane, *_ in shapes))  # as the lanes first appear
    kept = set(sorted(order, key=lambda lane: latest.get(lane, 0), reverse=True)[:MAX_LANES])
    hidden = len(order) - len(kept)
    lanes = {lane: row for row, lane in enumerate(lane for lane in order if lane in kept)}
    shapes = [shape for shape in shapes if shape[0] in kept]
    legend = _legend_places()
    rows = 1 + max(row for _, row in legend)
    height = TOP + LANE * max(len(lanes), 1) + 40 + 16 * (rows - 1)
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" role="img" width="{WIDTH}" height="{height}" '
        f'viewBox="0 0 {WIDTH} {height}" class="timeline" aria-label="lock timeline">'
    ]
    minutes = span / 60000
    out.append(f'<text x="{LEFT}" y="14" font-size="11">last {minutes:.0f} min</text>')
    out.append(f'<text x="{WIDTH - 10}" y="14" font-size="11" text-anchor="end">now</text>')
    if hidden:
        out.append(
            f'<text x="{LEFT + 90}" y="14" font-size="11" class="hidden-lanes">{hidden} more '
            f"keys not drawn (the {MAX_LANES} of the latest events are): choose one by key</text>"
        )
    for lane, row in lanes.items():
        y = TOP + row * LANE
        out.append(
            f'<text x="4" y="{y + 15}" font-size="11" font-family="monospace">'
            f"{escape(_short(safe(lane)))}<title>{escape(safe(lane))}</title></text>"
        )
        out.append(
            f'<line x1="{LEFT}" x2="{WIDTH - 10}" y1="{y + 11}" y2="{y + 11}" stroke="#ddd"/>'
        )
    for lane, x1, x2, e in shapes:
        y = TOP + lanes[lane] * LANE
        out.append(_mark(x1, y, str(e.get("event")), e) if x2 < 0 else _bar(x1, x2, y, e))
    for (event, color), (lx, row) in zip(COLORS.items(), legend, strict=True):
        ly = height - 12 - 16 * (rows - 1 - row)
        out.append(f'<rect x="{lx}" y="{ly - 9}" width="10" height="10" fill="{color}"/>')
        out.append(f'<text x="{lx + 14}" y="{ly}" font-size="{LEGEND_FONT}">{event}</text>')
    out.append("</svg>")
    return Markup("".join(out))


def _legend_places() -> list[tuple[int, int]]:
    """``(x, row)`` of each legend entry (a swatch, then its label): placed by the width of
    the labels before it, and wrapped to another row where an entry would end past the
    picture's right edge."""
    places: list[tuple[int, int]] = []
    x = row = 0
    for event in COLORS:
        size = 14 + LEGEND_CHAR * len(event)  # the swatch and its gap, then the label
        if places and 10 + x + size > WIDTH - 10:
            x, row = 0, row + 1
        places.append((10 + x, row))
        x += size + 16
    return places


def _lane(e: dict[str, Any]) -> str:
    return str(e.get("key") or f"({e.get('task')})")


def _short(text: str, size: int = 36) -> str:
    return text if len(text) <= size else "..." + text[-(size - 3) :]


def _bar(x1: float, x2: float, y: int, e: dict[str, Any]) -> str:
    title = f"held by task {e.get('id')}"
    return (
        f'<rect class="bar" data-id="{escape(e.get("id", ""))}" x="{x1:.1f}" y="{y + 4}" '
        f'width="{max(x2 - x1, 2):.1f}" height="14" rx="2" fill="{COLORS["acquired"]}" '
        f'fill-opacity="0.55"><title>{escape(safe(title))}</title></rect>'
    )


def _mark(x: float, y: int, event: str, e: dict[str, Any]) -> str:
    color = COLORS.get(event, "#999")
    title = f"{event}: task {e.get('id')} ({e.get('task')})"
    if e.get("holder"):
        title += f", held by {e['holder']}"
    if e.get("by"):
        title += f", by the {e['by']}"
    return (
        f'<circle class="mark" data-event="{escape(event)}" data-id="{escape(e.get("id", ""))}" '
        f'cx="{x:.1f}" cy="{y + 11}" r="5" fill="{color}" stroke="#fff">'
        f"<title>{escape(safe(title))}</title></circle>"
    )
