"""What Linux ``/proc`` tells about a process: whether it lives, its children, its start time,
whether a SIGKILL is pending.

Test and checker code only (the package itself must work without ``/proc``). Every read that
fails (no such process, no ``/proc``) answers as for a process that is gone.
"""

from __future__ import annotations

from pathlib import Path


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (field 3 onwards)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rpartition(")")[2].split()


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie."""
    fields = _stat_fields(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def start_time(pid: int) -> str | None:
    """Field 22 of ``/proc/<pid>/stat``: the start time in clock ticks, ``None`` if gone.

    With the pid it names one process: a pid reused by a new process is never mistaken for
    the old one.
    """
    fields = _stat_fields(pid)
    return fields[19] if fields is not None and len(fields) > 19 else None


def children(pid: int) -> list[int]:
    """The child processes of ``pid`` (of its main thread), ``[]`` if it is gone."""
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def sigkill_pending(pid: int) -> bool:
    """Whether ``pid`` has a SIGKILL pending: it will never run user code again, although
    ``/proc`` may still show it running for a moment. ``False`` if it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return any(
        line.startswith(("SigPnd:", "ShdPnd:")) and int(line.split()[1], 16) & (1 << 8)
        for line in status.splitlines()
    )
