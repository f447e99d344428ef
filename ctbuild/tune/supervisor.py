"""Supervised measuring processes: ``ctbuild tune`` runs its loop (`ctbuild.tune.session`) in a
child process per lane, so that a candidate that breaks its CUDA context costs only that kernel
x workload's measurement, which is retried without the culprit.

The supervisor follows the child's events (a JSON line per entry started, candidate launched,
entry done), kills a child that stalls, and restarts one that died on the entries left.
"""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from .claims import Claims
from .gate import Gate
from .race import SPAN_BUDGET
from .session import Entry, TuneOptions, summarize
from .warm import hand, session_process

#: How often the supervisor reads a child's events while it runs, in seconds: an entry's end,
#: or a lane's ``idle`` the fleet's finals wait on, is seen this late at most (a child's exit
#: at once).
EVENTS_POLL_S = 0.05
#: Seconds a launch the child said is starting (``launching``) may take beyond its timeout
#: (``--timeout``) before the child counts as hung: the events' latency. (With 5 s, the
#: fixture's "hang", a loop of 2^32 iterations, ended within the slack on an H200 and was
#: measured for 80 s.)
LAUNCH_SLACK_S = 0.5


def run_isolated(config_path: str | None, cache_dir: str, entries: Sequence[Entry],
                 opts: TuneOptions, *, only: Sequence[str] = (), entry_timeout_s: float | None = None,
                 max_restarts: int = 8,
                 emit: Callable[[dict[str, Any]], None] | None = None,
                 env: Mapping[str, str] | None = None, gate: Gate | None = None,
                 finals: Gate | None = None,
                 on_event: Callable[[dict[str, Any]], None] | None = None,
                 claims: Claims | None = None, warm: subprocess.Popen | None = None
                 ) -> list[dict[str, Any]]:
    """Run `tune_entries` in a child process with ``env`` added to its environment; if it dies
    (a fault: `ctbuild.tune.race.ContextLost`), hangs in a launch or stalls, restart it on the
    remaining entries, excluding the candidate that was being measured (recorded as a failure of that
    entry). With a ``gate``, the child measures once it opens (`ctbuild.tune.gate`); one that
    says stop leaves the entries untuned. With ``finals``, the child then says ``idle`` and
    waits there for the fleet's finals (JSON: configs per entry index), runs them
    (`finals_entries`) and exits; ``on_event`` gets the ``idle`` and ``finals`` events. With
    ``claims`` (a lane of several GPUs), ``entries`` are every lane's, in the order to claim
    them: the child tunes those it claims, and an entry another lane claimed is not this
    lane's to finish. ``warm``: a process started for this lane before (`ctbuild.tune.warm`),
    the first child if it is still there.
    """
    run = _Supervision(entries, emit, on_event, claims)
    per_entry = entry_timeout_s or _entry_budget(opts)
    with tempfile.TemporaryDirectory(prefix="ctbuild-tune-") as tmp:
        while run.remaining:
            events_path = Path(tmp) / f"events-{run.restarts}.jsonl"
            spec = {"config": config_path, "cache": cache_dir, "entries": run.remaining,
                    "only": list(only), "exclude": {str(k): v for k, v in run.exclude.items()},
                    "opts": {**opts.__dict__}, "events": str(events_path),
                    "gate": str(gate.path) if gate else None,
                    "finals": str(finals.path) if finals else None,
                    "claims": [str(claims.path), claims.lane] if claims else None,
                    "supervisor": os.getpid()}
            spec_path = Path(tmp) / f"spec-{run.restarts}.json"
            spec_path.write_text(json.dumps(spec))
            proc = warm if warm is not None and hand(warm, spec_path) else \
                session_process(str(spec_path), env)
            warm = None
            watch = run.follow(proc, events_path, per_entry)
            run.drop_claimed_elsewhere()
            if not run.remaining or (gate is not None and gate.stopped()):
                break
            run.restart(watch, proc.returncode, max_restarts)
    return [run.results[e.index] for e in entries if e.index in run.results]


@dataclass
class _Watch:
    """What the supervisor saw of one child process: the entry it was tuning (None between
    entries) and the candidate it last started measuring, from its events; how far its events
    file was read; whether it stalled."""
    current: int | None = None
    last_cfg: dict[str, Any] | None = None
    started: float = field(default_factory=time.monotonic)
    offset: int = 0
    #: a launch under way: (when it started, the seconds it may take), from ``launching``
    launch: tuple[float, float] | None = None
    #: why it was killed, where it stalled ("": it did not)
    why: str = ""

    @property
    def stalled(self) -> bool:
        return bool(self.why)

    def overdue(self, per_entry: float) -> str | None:
        """Why the child counts as stalled now (None: it does not): one launch took longer
        than its timeout (and `LAUNCH_SLACK_S`), or one entry longer than ``per_entry``."""
        now = time.monotonic()
        if self.launch is not None and now - self.launch[0] > self.launch[1] + LAUNCH_SLACK_S:
            return f"a launch hung (killed after {now - self.launch[0]:.0f} s)"
        if self.current is not None and now - self.started > per_entry:
            return f"stalled (killed after {per_entry:.0f} s)"
        return None


class _Supervision:
    """The state of one `run_isolated` across the child processes it starts: the summaries so
    far, the entries left, the candidates excluded per entry and the restarts."""

    def __init__(self, entries: Sequence[Entry],
                 emit: Callable[[dict[str, Any]], None] | None,
                 on_event: Callable[[dict[str, Any]], None] | None = None,
                 claims: Claims | None = None) -> None:
        self.entries = entries
        self.emit = emit
        self.on_event = on_event
        self.claims = claims
        self.results: dict[int, dict[str, Any]] = {}
        self.exclude: dict[int, dict[str, str]] = {}
        self.remaining = [e.index for e in entries]
        self.restarts = 0

    def follow(self, proc: subprocess.Popen, events_path: Path, per_entry: float) -> _Watch:
        """Read the child's events until it exits, or kill it when one entry takes longer than
        ``per_entry`` seconds; each finished entry's summary is kept and emitted as it comes."""
        watch = _Watch()
        while True:
            rc = proc.poll()
            for ev in _read_events(events_path, watch):
                if ev["event"] == "start":
                    watch.current, watch.last_cfg = ev["entry"], None
                    watch.started = time.monotonic()
                elif ev["event"] == "launching":
                    watch.last_cfg = ev["config"]
                    watch.launch = None if ev["timeout"] is None else \
                        (time.monotonic(), float(ev["timeout"]))
                elif ev["event"] == "launched":
                    watch.launch = None
                elif ev["event"] == "done":
                    s = ev["summary"]
                    self.results[ev["entry"]] = s
                    if ev["entry"] in self.remaining:
                        self.remaining.remove(ev["entry"])
                    watch.current = None
                    if self.emit:
                        self.emit(s)
                elif ev["event"] in ("idle", "finals"):
                    watch.current = None
                    if self.on_event:
                        self.on_event(ev)
            if rc is not None:
                return watch
            why = watch.overdue(per_entry)
            if why is not None:
                watch.why = why
                proc.kill()
                proc.wait()
                return watch
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(EVENTS_POLL_S)  # back at once when it exits, its last events written

    def drop_claimed_elsewhere(self) -> None:
        """Forget the entries another lane claimed: theirs to finish."""
        if self.claims is not None:
            self.remaining = [i for i in self.remaining if self.claims.open_to_me(i)]

    def _next(self) -> int | None:
        """The entry a child that died between entries is blamed for: the next one left, claimed
        for this lane (None: another lane claimed every one)."""
        if self.claims is None:
            return self.remaining[0]
        return next((i for i in self.remaining if self.claims.take(i)), None)

    def restart(self, watch: _Watch, returncode: int | None, max_restarts: int) -> None:
        """After a child died or stalled: exclude the candidate it was measuring, so the next
        child tunes that entry without it; with no candidate to blame (or too many restarts),
        record the entry as failed instead."""
        self.restarts += 1
        why = watch.why if watch.stalled else f"tuning process died (exit {returncode})"
        culprit = watch.current if watch.current is not None else self._next()
        if culprit is None:  # every entry left was claimed by another lane meanwhile
            self.remaining.clear()
            return
        if watch.last_cfg is not None and self.restarts <= max_restarts:
            key = json.dumps(watch.last_cfg, sort_keys=True)
            self.exclude.setdefault(culprit, {})[key] = (
                f"process: {why} while measuring this candidate")
            return
        e = next(x for x in self.entries if x.index == culprit)
        s = summarize(e, "failed", None, "", why)
        self.results[culprit] = s
        self.remaining.remove(culprit)
        if self.emit:
            self.emit(s)


def _entry_budget(opts: TuneOptions) -> float:
    # exhaustive_search stops measuring a candidate after ~5 s; add warm-ups and compile waits.
    per_candidate = 6.0 + 2 * (opts.timeout_s or 10.0)
    return 120.0 + per_candidate * opts.cap + 8 * SPAN_BUDGET.max_seconds + \
        (600.0 if opts.compile_missing else 0.0)


def _read_events(path: Path, watch: _Watch) -> list[dict[str, Any]]:
    """The events the child wrote since the last read: whole lines from ``watch.offset`` on (a
    line being written is read next time), so a long tune's events are parsed once each."""
    try:
        with open(path, "rb") as f:
            f.seek(watch.offset)
            chunk = f.read()
    except FileNotFoundError:
        return []
    whole = chunk[:chunk.rfind(b"\n") + 1]
    watch.offset += len(whole)
    out = []
    for line in whole.splitlines():
        with contextlib.suppress(ValueError):  # not one of the child's lines: nothing to follow
            out.append(json.loads(line))
    return out
