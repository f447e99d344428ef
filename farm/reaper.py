"""A watchdog that outlives a killed driver just long enough to stop what the driver started.

Ray's local processes (GCS, raylet, their agents, the workers) are descendants of the driver
that started them; when the driver dies by SIGKILL (an OOM kill) some of them survive it. The
driver starts this script as a separate process (its own session, so it is not killed with the
driver's process group) holding the read end of a pipe. It keeps a list of the driver's
descendants that appeared after it started, rescanning ``/proc`` twice a second while Ray starts
(its daemons and agents appear then) and every few seconds after that, so that on a small
machine it takes next to no CPU from the compiles (a process that appears later is a child of
one it already watches, and found when it kills). When the pipe reaches EOF without a goodbye
(the driver is gone) it SIGKILLs every one of them still alive (checked by start time, so a
reused PID is never hit), then exits. Standard library only: it runs as a plain script, not as
part of the package.
"""
from __future__ import annotations

import os
import select
import signal
import sys
import time
from pathlib import Path

#: Seconds between scans of ``/proc`` for the first `STARTUP_SECONDS`, then `LATER_SCAN_SECONDS`.
SCAN_SECONDS = 0.5
STARTUP_SECONDS = 30.0
LATER_SCAN_SECONDS = 3.0


def _stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, start time) of ``pid``, or None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()
    return int(fields[1]), int(fields[19])


def process_table() -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, start time) of every process, from ``/proc`` (OSError elsewhere)."""
    table = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (st := _stat(int(name))) is not None:
            table[int(name)] = st
    return table


def _descendants(roots: set[int], table: dict[int, tuple[int, int]]) -> set[int]:
    found: set[int] = set()
    frontier = set(roots)
    while frontier:
        frontier = {pid for pid, (ppid, _) in table.items() if ppid in frontier} - found
        found |= frontier
    return found


def freeze_tree(root: int, *, with_root: bool = True) -> dict[int, int]:
    """SIGSTOP every process below ``root`` (and ``root`` itself ``with_root``), rescanning
    until none appears (a stopped process starts nothing more); pid -> start time of each.

    A worker killed while it compiles would leave its compiler running, reparented away from
    the driver; its frozen tree is killed with it (`kill_frozen`). A worker whose killing is
    someone else's (Ray's) keeps running: it only waits on its stopped compiler meanwhile."""
    frozen: dict[int, int] = {}
    seen: set[int] = set()
    table = process_table()
    found = _descendants({root}, table) | ({root} & set(table) if with_root else set())
    while found:
        seen |= found
        for pid in found:
            try:
                os.kill(pid, signal.SIGSTOP)
            except OSError:
                continue
            frozen[pid] = table[pid][1]
        table = process_table()
        found = _descendants({root} | seen, table) - seen - {root}
    return frozen


def kill_frozen(frozen: dict[int, int], *, after: int | None = None, wait: float = 5.0) -> None:
    """SIGKILL what `freeze_tree` stopped, each only while its start time is unchanged; with
    ``after``, once that process is gone (up to ``wait`` seconds), so that it cannot start
    another compile when it sees this one die."""
    deadline = time.monotonic() + wait
    while after is not None and _stat(after) is not None and time.monotonic() < deadline:
        time.sleep(0.02)
    for pid, start in frozen.items():
        st = _stat(pid)
        if st is not None and st[1] == start:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


def watch(driver: int, pipe: int) -> None:
    before = set(process_table()) | {os.getpid()}  # what existed already is not the farm's
    watched: dict[int, int] = {}
    started = time.monotonic()
    while True:
        early = time.monotonic() - started < STARTUP_SECONDS
        ready, _, _ = select.select([pipe], [], [], SCAN_SECONDS if early else LATER_SCAN_SECONDS)
        table = process_table()
        for pid in _descendants({driver, *watched}, table) - before:
            watched.setdefault(pid, table[pid][1])
        if ready:
            data = os.read(pipe, 64)
            if data:  # a goodbye: the driver shut down normally
                return
            break
    for _ in range(3):  # kill, then catch anything spawned meanwhile
        table = process_table()
        for pid in _descendants(set(watched), table) - before:
            watched.setdefault(pid, table[pid][1])
        for pid, start in watched.items():
            st = table.get(pid)
            if st is not None and st[1] == start:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass


if __name__ == "__main__":
    watch(int(sys.argv[1]), int(sys.argv[2]))
