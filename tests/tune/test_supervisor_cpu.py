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


def _child_saying(events: Path, timeout_s: float | None, said: list, then_sleep: float):
    """A real child process that writes what a measuring process with ``timeout_s`` says of
    the launches ``said`` (configs, None: the last one returned) after an entry's start, then
    sleeps; and the supervision following nothing but it."""
    import subprocess
    import sys
    from types import SimpleNamespace

    from ctbuild.space import Config
    from ctbuild.tune.session import TuneOptions, _tellers
    from ctbuild.tune.supervisor import _Supervision
    lines: list[dict] = [{"event": "start", "entry": 0}]
    say = _tellers(0, TuneOptions(timeout_s=timeout_s), lines.append)["on_launch"]
    for cfg in said:
        say(Config(cfg) if cfg is not None else None)
    script = (f"import time\nf = open({str(events)!r}, 'a', buffering=1)\n"
              f"f.write({''.join(json.dumps(e) + chr(10) for e in lines)!r})\n"
              f"time.sleep({then_sleep})\n")
    run = _Supervision([SimpleNamespace(index=0)], None)  # type: ignore[list-item]
    return subprocess.Popen([sys.executable, "-c", script]), run


def test_a_child_whose_launch_hangs_is_killed_and_that_candidate_excluded(tmp_path: Path) -> None:
    """A real child says it launches T=1 (which returns), then T=2, and never returns: it is
    killed once T=2's launch has taken its timeout and the slack, long before the entry's
    budget, and T=2 is the candidate the next child tunes without. (A config that hangs only
    inside its bucket passes the timed first launch at the top: the child used to wait out
    the entry's whole budget, 900 s with the default cap.)"""
    import signal
    import time

    from ctbuild.tune.supervisor import LAUNCH_SLACK_S
    events = tmp_path / "events.jsonl"
    started = time.monotonic()
    proc, run = _child_saying(events, 0.1, [{"T": 1}, None, {"T": 2}], 120)
    watch = run.follow(proc, events, per_entry=600.0)
    took = time.monotonic() - started
    assert proc.returncode is not None and watch.stalled and watch.last_cfg == {"T": 2}
    # killed by the supervisor on the launch's timeout (not its own end after 120 s, nor the
    # entry's budget), and only once the timeout and the slack had passed
    assert watch.why.startswith("a launch hung") and proc.returncode == -signal.SIGKILL
    assert took > LAUNCH_SLACK_S
    run.restart(watch, proc.returncode, max_restarts=8)
    assert run.exclude == {0: {'{"T": 2}': f"process: {watch.why} while measuring this "
                                          "candidate"}}
    assert run.remaining == [0]  # tuned again, without T=2


def test_a_bench_tells_each_first_launch_before_it_and_once_it_returned() -> None:
    """What a measuring process says of its launches (`Bench.tell`, `Bench.settle`): a config's
    first launch on these inputs is said before it starts and once it returned (the next
    launch's arguments, or `settle`, say so); its later launches say nothing; ``always`` (the
    output check's launches) says it again where another config was said last, so a hang
    there is blamed on the right one."""
    import sys

    import torch

    from ctbuild.space import Config
    from ctbuild.specs import Workload
    from ctbuild.tune.measuring import Bench
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
    from demo_kernels.elementwise import silu_mul
    said: list[Config | None] = []
    bench = Bench(silu_mul, Workload({n: torch.zeros(8) for n in ("X", "Y", "OUT")}), None,
                  None, lambda cfg: None, on_launch=said.append)
    a, c = Config({"TILE": 512, "occupancy": 1}), Config({"TILE": 1024, "occupancy": 2})
    assert bench.args(a)[-1] == 512
    bench.args(a)          # a returned; its second launch says nothing
    bench.args(c)
    bench.settle()
    bench.args(a)          # a's later launch: nothing
    bench.args(a, True)    # c was said last: a again
    bench.settle()
    bench.settle()         # nothing pending: nothing said
    assert said == [a, None, c, None, a, None]


def test_a_launch_without_a_timeout_is_blamed_but_never_killed(tmp_path: Path) -> None:
    """With no ``--timeout`` (``timeout_s=None``) a launch still names its candidate, to blame
    if the process dies, but the supervisor does not watch its time: a child that says so and
    then takes longer than the slack exits on its own, not stalled."""
    from ctbuild.tune.supervisor import LAUNCH_SLACK_S
    events = tmp_path / "events.jsonl"
    proc, run = _child_saying(events, None, [{"T": 3}], 2 * LAUNCH_SLACK_S + 0.5)
    watch = run.follow(proc, events, per_entry=600.0)
    assert proc.returncode == 0 and not watch.stalled and watch.last_cfg == {"T": 3}
