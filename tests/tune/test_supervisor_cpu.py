"""How the supervisor reads a measuring process's events (a real file, written as the child
writes it: a line at a time, the last one possibly half-written)."""
from __future__ import annotations

import json
from pathlib import Path

from ctbuild.tune.supervisor import _read_events, _Watch


def test_events_are_read_once_each_and_a_half_written_line_waits(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    watch = _Watch()
    assert _read_events(path, watch) == []  # the child has not opened it yet
    first, second = {"event": "start", "entry": 0}, {"event": "candidate", "entry": 0}
    line = json.dumps(second)
    with open(path, "a") as f:
        f.write(json.dumps(first) + "\n" + line[:10])
    assert _read_events(path, watch) == [first]
    with open(path, "a") as f:
        f.write(line[10:] + "\nnot json\n")
    assert _read_events(path, watch) == [second]  # the rest of the line; garbage is skipped
    assert _read_events(path, watch) == []  # nothing is read twice
    assert watch.offset == path.stat().st_size
