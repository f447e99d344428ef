"""``ctbuild tune``'s loop over kernels x workloads, optionally supervised in a child process.

`run_isolated` runs the loop in a child so that a candidate that breaks its CUDA context costs
only that kernel x workload's measurement, which is retried without the culprit.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from ..arch import Arch
from ..compile.compile_pool import CompilePool
from ..compile.plan import job_for
from ..declare import DEFAULT_CAP, TunedKernel
from ..records import TuningRecord, stored_tuning
from ..specs import Workload, describe
from ..toolchain import toolchain_for
from .choice import DEFAULT_BAND_PERCENT, TieBand
from .gate import Gate
from .race import SPAN_BUDGET
from .recorded import recorded_workloads
from .span import DEFAULT_SPLITS
from .tuner import Device, TuneSettings, context_ok, current_device, record_key, tune_workload

if TYPE_CHECKING:
    from ctbuild.cache import Store

log = logging.getLogger("ctbuild")

@dataclass
class Entry:
    """One kernel x workload to tune."""
    kernel: TunedKernel
    workload: Workload
    index: int

    @property
    def label(self) -> str:
        return f"{self.kernel.name} [{describe(self.workload)}]"


def entries_for(kernels: Sequence[TunedKernel], only: Sequence[str] = (),
                extra: Mapping[str, Sequence[Workload]] | None = None) -> list[Entry]:
    """Every declared workload (a dynamic one per bucket), then the ``extra`` ones (recorded
    at run time, see `ctbuild.tune.recorded`)."""
    out: list[Entry] = []
    for k in kernels:
        if only and k.name not in only:
            continue
        for w in list(k.workloads) + list((extra or {}).get(k.name, [])):
            out.append(Entry(k, w, len(out)))
    return out


def summarize(entry: Entry, status: str, record: TuningRecord | None, rkey: str,
              note: str = "") -> dict[str, Any]:
    """The CLI's per-entry line (and ``--json`` item); the full record rides along."""
    s: dict[str, Any] = {"entry": entry.index, "kernel": entry.kernel.name,
                         "workload": describe(entry.workload), "record_key": rkey,
                         "status": status}
    if note:
        s["note"] = note
    if record is not None:
        s.update({
            "winner": record.config, "mean_us": record.mean_us,
            "ci_us": record.ci_us, "default": record.default_config,
            "default_us": record.default_mean_us,
            "speedup_vs_default": record.speedup_vs_default,
            "measured": len(record.candidates),
            "failures": record.failures,
            "compiled_during_tune": record.compiled_during_tune,
            "compiles_during_measurement": record.compiles_during_measurement,
            "seconds": record.seconds, "record": record.to_json()})
    return s


@dataclass
class TuneOptions:
    retune: bool = False
    compile_missing: bool = False
    timeout_s: float | None = 10.0
    cap: int = DEFAULT_CAP
    paths: list[str] = field(default_factory=list)
    workers: int | None = None
    #: the tie band in percent of the fastest mean (`ctbuild.tune.choice.TieBand`)
    tie_band: float = DEFAULT_BAND_PERCENT
    #: ``--refine N``: split a Dim bucket at most N times where no config is within the band
    #: at all its sizes (`ctbuild.tune.span`); 0 (``--no-refine``): never; a kernel's own
    #: ``max_splits=`` wins
    refine: int = DEFAULT_SPLITS

    def settings(self, kernel: TunedKernel | None = None) -> TuneSettings:
        own = getattr(kernel, "max_splits", None)
        return TuneSettings(band=TieBand(self.tie_band),
                            max_splits=self.refine if own is None or not self.refine else own)


def tune_entries(entries: Sequence[Entry], store: Store, opts: TuneOptions, *,
                 device: Device | None = None, toolchain_fp: str | None = None,
                 exclude: Mapping[int, Mapping[str, str]] | None = None,
                 emit: Callable[[dict[str, Any]], None] | None = None,
                 on_event: Callable[[dict[str, Any]], None] | None = None,
                 isolated: bool = False, **workload_kwargs: Any) -> list[dict[str, Any]]:
    """Tune entries in this process, one after another; ``emit`` gets each summary as done.

    Compiles for every entry's missing candidates are submitted up front (``--compile-missing``)
    so that the pool works ahead while the GPU measures.
    """
    device = device or current_device()
    fp = toolchain_fp or toolchain_for(store)
    out: list[dict[str, Any]] = []
    todo: list[tuple[Entry, TuningRecord | None]] = []
    for e in entries:
        rkey = record_key(e.kernel, e.workload, device, fp)
        existing = None if opts.retune else stored_tuning(store, rkey)
        if existing is None:
            todo.append((e, existing))
            continue
        s = summarize(e, "skipped", existing, rkey, "already tuned (use --retune)")
        out.append(s)
        if emit:
            emit(s)
    pool = None
    if opts.compile_missing and todo:
        pool = CompilePool(store, workers=opts.workers, paths=opts.paths)
        for e, existing in todo:
            with contextlib.suppress(Exception):
                for cfg in [] if existing else e.kernel.candidates(
                        e.workload, Arch(device.arch), opts.cap).kept:
                    pool.submit(job_for(e.kernel, cfg, e.workload, device.arch, fp))
    try:
        for e, existing in todo:
            if on_event:
                on_event({"event": "start", "entry": e.index})
            cb = (lambda cfg, _i=e.index: on_event({"event": "candidate", "entry": _i,
                                                    "config": cfg.to_json()})) \
                if on_event else None
            s = _tune_one(e, existing, store, opts, device, fp, pool,
                          (exclude or {}).get(e.index), cb, workload_kwargs)
            if isolated and not context_ok():
                # The CUDA context is broken: leave, unreported, so the supervisor restarts
                # this entry without the candidate it last saw launching.
                log.error("CUDA context broken while tuning %s; restarting", e.label)
                sys.stderr.flush()
                os._exit(70)
            out.append(s)
            if emit:
                emit(s)
    finally:
        if pool is not None:
            pool.close()
    return out


def _tune_one(e: Entry, existing: TuningRecord | None, store: Store, opts: TuneOptions,
              device: Device, fp: str, pool: CompilePool | None,
              exclude: Mapping[str, str] | None, cb: Callable[[Any], None] | None,
              workload_kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """One entry's summary: tuned, or skipped when it has a record."""
    rkey = record_key(e.kernel, e.workload, device, fp)
    try:
        if existing is not None:
            return summarize(e, "skipped", existing, rkey, "already tuned (use --retune)")
        record = tune_workload(
            e.kernel, e.workload, store=store, toolchain_fp=fp, device=device,
            cap=opts.cap, timeout_s=opts.timeout_s, exclude=exclude, pool=pool,
            on_candidate=cb, settings=opts.settings(e.kernel), **workload_kwargs)
        status = "tuned" if record.config is not None else "failed"
        return summarize(e, status, record, rkey,
                         "" if status == "tuned" else "no candidate could be measured")
    except Exception as exc:  # noqa: BLE001 - one entry's error never stops the run
        log.debug("tuning %s failed", e.label, exc_info=True)
        s = summarize(e, "failed", None, rkey, f"{type(exc).__name__}: {exc}")
        s["traceback"] = traceback.format_exc(limit=8)
        return s


# ---- supervision: a child process per run, restarted without the culprit -------------------
def run_isolated(config_path: str | None, cache_dir: str, entries: Sequence[Entry],
                 opts: TuneOptions, *, only: Sequence[str] = (), entry_timeout_s: float | None = None,
                 max_restarts: int = 8,
                 emit: Callable[[dict[str, Any]], None] | None = None,
                 env: Mapping[str, str] | None = None, gate: Gate | None = None,
                 finals: Gate | None = None,
                 on_event: Callable[[dict[str, Any]], None] | None = None
                 ) -> list[dict[str, Any]]:
    """Run `tune_entries` in a child process with ``env`` added to its environment; if it dies
    (a fault that escaped cuTile's benchmark subprocess) or stalls, restart it on the remaining
    entries, excluding the candidate that was being measured (recorded as a failure of that
    entry). With a ``gate``, the child measures once it opens (`ctbuild.tune.gate`); one that
    says stop leaves the entries untuned. With ``finals``, the child then says ``idle`` and
    waits there for the fleet's finals (JSON: configs per entry index), runs them
    (`finals_entries`) and exits; ``on_event`` gets the ``idle`` and ``finals`` events.
    """
    run = _Supervision(entries, emit, on_event)
    per_entry = entry_timeout_s or _entry_budget(opts)
    with tempfile.TemporaryDirectory(prefix="ctbuild-tune-") as tmp:
        while run.remaining:
            events_path = Path(tmp) / f"events-{run.restarts}.jsonl"
            spec = {"config": config_path, "cache": cache_dir, "entries": run.remaining,
                    "only": list(only), "exclude": {str(k): v for k, v in run.exclude.items()},
                    "opts": {**opts.__dict__}, "events": str(events_path),
                    "gate": str(gate.path) if gate else None,
                    "finals": str(finals.path) if finals else None}
            spec_path = Path(tmp) / f"spec-{run.restarts}.json"
            spec_path.write_text(json.dumps(spec))
            proc = subprocess.Popen([sys.executable, "-m", "ctbuild.tune.session", str(spec_path)],
                                    stdout=sys.stderr, env={**os.environ, **(env or {})})
            watch = run.follow(proc, events_path, per_entry)
            if not run.remaining or (gate is not None and gate.stopped()):
                break
            run.restart(watch, proc.returncode, per_entry, max_restarts)
    return [run.results[e.index] for e in entries if e.index in run.results]


@dataclass
class _Watch:
    """What the supervisor saw of one child process: the entry it was tuning (None between
    entries) and the candidate it last started measuring, from its events; whether it stalled."""
    current: int | None = None
    last_cfg: dict[str, Any] | None = None
    started: float = field(default_factory=time.monotonic)
    seen: int = 0
    stalled: bool = False


class _Supervision:
    """The state of one `run_isolated` across the child processes it starts: the summaries so
    far, the entries left, the candidates excluded per entry and the restarts."""

    def __init__(self, entries: Sequence[Entry],
                 emit: Callable[[dict[str, Any]], None] | None,
                 on_event: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.entries = entries
        self.emit = emit
        self.on_event = on_event
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
            for ev in _read_events(events_path, watch.seen):
                watch.seen += 1
                if ev["event"] == "start":
                    watch.current, watch.last_cfg = ev["entry"], None
                    watch.started = time.monotonic()
                elif ev["event"] == "candidate":
                    watch.last_cfg = ev["config"]
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
            if watch.current is not None and time.monotonic() - watch.started > per_entry:
                watch.stalled = True
                proc.kill()
                proc.wait()
                return watch
            time.sleep(0.2)

    def restart(self, watch: _Watch, returncode: int | None, per_entry: float,
                max_restarts: int) -> None:
        """After a child died or stalled: exclude the candidate it was measuring, so the next
        child tunes that entry without it; with no candidate to blame (or too many restarts),
        record the entry as failed instead."""
        self.restarts += 1
        why = (f"stalled (killed after {per_entry:.0f} s)" if watch.stalled
               else f"tuning process died (exit {returncode})")
        culprit = watch.current if watch.current is not None else self.remaining[0]
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


def _read_events(path: Path, skip: int) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    out = []
    for line in lines[skip:]:
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            break  # a line being written; read it next time
    return out


def _child(spec_path: str) -> int:
    """The supervised tuning process (``python -m ctbuild.tune.session SPEC``)."""
    spec = json.loads(Path(spec_path).read_text())
    if spec["opts"].get("timeout_s") is not None:
        from .. import cutile
        cutile.start_timed_benchmark_worker()
    from ctbuild.cache import Store

    from ..project import load_project
    project = load_project(spec["config"], cache_dir=spec["cache"])
    kernels = project.kernels()
    store = Store(spec["cache"])
    every = entries_for(kernels, spec["only"],
                        recorded_workloads(store, kernels, current_device().arch))
    wanted = set(spec["entries"])
    entries = [e for e in every if e.index in wanted]
    opts = TuneOptions(**spec["opts"])
    events = open(spec["events"], "a", buffering=1)
    lock = threading.Lock()

    def write(ev: dict[str, Any]) -> None:
        with lock:
            events.write(json.dumps(ev, default=str) + "\n")
            events.flush()

    def emit(s: dict[str, Any]) -> None:
        write({"event": "done", "entry": s["entry"], "summary": s})

    if spec.get("gate") and not Gate(spec["gate"]).wait():
        return 0
    tune_entries(entries, store, opts, exclude={int(k): v for k, v in spec["exclude"].items()},
                 emit=emit, on_event=write, isolated=True)
    if spec.get("finals"):
        write({"event": "idle"})
        posted = json.loads(Gate(spec["finals"]).read() or "{}")
        finals_entries([e for e in every if str(e.index) in posted], store, opts,
                       {int(k): v for k, v in posted.items()}, on_event=write,
                       emit=lambda s: write({"event": "finals", "entry": s["entry"],
                                             "summary": s}))
    return 0


def finals_entries(entries: Sequence[Entry], store: Store, opts: TuneOptions,
                   configs: Mapping[int, Sequence[Mapping[str, Any]]],
                   emit: Callable[[dict[str, Any]], None],
                   on_event: Callable[[dict[str, Any]], None]) -> None:
    """The fleet's finals on this GPU: each entry's ``configs`` run off interleaved; emits
    ``{"status": "finals", "timings": [...]}`` per entry (`ctbuild.tune.fleet`)."""
    import torch

    from ..space import Config
    from .measuring import Benches
    from .race import race
    device = current_device()
    fp = toolchain_for(store)
    with torch.cuda.device(device.index):
        for e in entries:
            on_event({"event": "start", "entry": e.index})
            cfgs = [Config(c, e.kernel.name) for c in configs.get(e.index, [])]

            def blame(cfg: Config, index: int = e.index) -> None:
                on_event({"event": "candidate", "entry": index, "config": cfg.to_json()})
            bench = Benches(e.kernel, store, fp, device, on_candidate=blame).on_spec(e.workload)
            result = race(cfgs, bench.sample, opts.settings().band) \
                if len(cfgs) > 1 else None
            emit({"entry": e.index, "kernel": e.kernel.name, "status": "finals",
                  "timings": [t.to_json() for t in (result.timings if result else ())],
                  "gpu": device.name})


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, format="ctbuild: %(levelname)s: %(message)s")
    sys.exit(_child(sys.argv[1]))
