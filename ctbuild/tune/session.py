"""``ctbuild tune``'s loop over kernels x workloads, and the child process that runs it under a
supervisor (`ctbuild.tune.supervisor`; ``python -m ctbuild.tune.session SPEC``).
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import threading
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from ..arch import Arch
from ..compile.compile_pool import CompilePool
from ..compile.plan import job_for
from ..declare import DEFAULT_CAP, TunedKernel
from ..records import TuningRecord, stored_tuning
from ..space import Config
from ..specs import Workload, describe
from ..toolchain import toolchain_for
from .choice import DEFAULT_BAND_PERCENT, TieBand
from .claims import Claims
from .gate import Gate
from .measuring import context_ok
from .recorded import recorded_workloads
from .span import DEFAULT_SPLITS
from .tuner import Device, TuneSettings, current_device, record_key, tune_workload
from .warm import wait_for_spec

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
                 isolated: bool = False, claims: Claims | None = None,
                 **workload_kwargs: Any) -> list[dict[str, Any]]:
    """Tune entries in this process, one after another; ``emit`` gets each summary as done.
    With ``claims`` (a lane of several GPUs), only the entries this lane claims as it reaches
    them (`ctbuild.tune.claims`).
    """
    device = device or current_device()
    fp = toolchain_fp or toolchain_for(store)
    out: list[dict[str, Any]] = []
    ahead = _CompileAhead(store, opts, device, fp)

    known: dict[int, TuningRecord | None] = {}

    def existing(e: Entry) -> TuningRecord | None:  # read once: --compile-missing asks first
        if e.index not in known:
            known[e.index] = None if opts.retune else stored_tuning(
                store, record_key(e.kernel, e.workload, device, fp))
        return known[e.index]
    if claims is None and opts.compile_missing:
        ahead.submit([e for e in entries if existing(e) is None])
    try:
        for e in entries:
            if claims is not None and not claims.take(e.index):
                continue
            found = existing(e)
            if found is None and claims is not None:
                ahead.submit([e])
            if on_event and found is None:
                on_event({"event": "start", "entry": e.index})
            s = _tune_one(e, found, store, opts, device, fp, ahead.pool,
                          (exclude or {}).get(e.index), _tellers(e.index, opts, on_event),
                          workload_kwargs)
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
        ahead.close()
    return out


class _CompileAhead:
    """``--compile-missing``: a local pool compiling entries' missing candidates while the GPU
    measures, started with the first entry submitted. A single process submits every entry up
    front; a lane of several GPUs each entry as it claims it (the others are other lanes')."""

    def __init__(self, store: Store, opts: TuneOptions, device: Device, fp: str) -> None:
        self.store, self.opts, self.device, self.fp = store, opts, device, fp
        self.pool: CompilePool | None = None

    def submit(self, entries: Sequence[Entry]) -> None:
        if not self.opts.compile_missing or not entries:
            return
        self.pool = self.pool or CompilePool(self.store, workers=self.opts.workers,
                                             paths=self.opts.paths)
        arch = self.device.arch
        for e in entries:
            with contextlib.suppress(Exception):
                for cfg in e.kernel.candidates(e.workload, Arch(arch), self.opts.cap).kept:
                    self.pool.submit(job_for(e.kernel, cfg, e.workload, arch, self.fp))

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()


def _tellers(entry: int, opts: TuneOptions,
             on_event: Callable[[dict[str, Any]], None] | None) -> dict[str, Any]:
    """The callback that tells the supervisor what an entry launches (`Bench.tell`): a
    launch that starts (``launching``: the candidate, and the time it may take, ``--timeout``;
    none: unbounded) or returned (``launched``)."""
    if on_event is None:
        return {}

    def launch(cfg: Config | None) -> None:
        on_event({"event": "launching", "entry": entry, "config": cfg.to_json(),
                  "timeout": opts.timeout_s} if cfg is not None else {"event": "launched"})
    return {"on_launch": launch}


def _tune_one(e: Entry, existing: TuningRecord | None, store: Store, opts: TuneOptions,
              device: Device, fp: str, pool: CompilePool | None,
              exclude: Mapping[str, str] | None, tellers: Mapping[str, Any],
              workload_kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """One entry's summary: tuned, or skipped when it has a record."""
    rkey = record_key(e.kernel, e.workload, device, fp)
    try:
        if existing is not None:
            return summarize(e, "skipped", existing, rkey, "already tuned (use --retune)")
        record = tune_workload(
            e.kernel, e.workload, store=store, toolchain_fp=fp, device=device,
            cap=opts.cap, timeout_s=opts.timeout_s, exclude=exclude, pool=pool,
            settings=opts.settings(e.kernel), **tellers, **workload_kwargs)
        status = "tuned" if record.config is not None else "failed"
        return summarize(e, status, record, rkey,
                         "" if status == "tuned" else "no candidate could be measured")
    except Exception as exc:  # noqa: BLE001 - one entry's error never stops the run
        log.debug("tuning %s failed", e.label, exc_info=True)
        s = summarize(e, "failed", None, rkey, f"{type(exc).__name__}: {exc}")
        s["traceback"] = traceback.format_exc(limit=8)
        return s


def _child(spec_path: str) -> int:
    """The supervised tuning process (``python -m ctbuild.tune.session SPEC``)."""
    spec = json.loads(Path(spec_path).read_text())
    from ctbuild.cache import Store

    from ..project import load_project
    project = load_project(spec["config"], cache_dir=spec["cache"])
    kernels = project.kernels()
    store = Store(spec["cache"])
    every = entries_for(kernels, spec["only"],
                        recorded_workloads(store, kernels, current_device().arch))
    by_index = {e.index: e for e in every}
    entries = [by_index[i] for i in spec["entries"] if i in by_index]
    claims = Claims(*spec["claims"]) if spec.get("claims") else None
    opts = TuneOptions(**spec["opts"])
    events = open(spec["events"], "a", buffering=1)
    lock = threading.Lock()

    def write(ev: dict[str, Any]) -> None:
        with lock:
            events.write(json.dumps(ev, default=str) + "\n")
            events.flush()

    def emit(s: dict[str, Any]) -> None:
        write({"event": "done", "entry": s["entry"], "summary": s})

    if spec.get("gate") and not Gate(spec["gate"]).wait(spec["supervisor"]):
        return 0
    tune_entries(entries, store, opts, exclude={int(k): v for k, v in spec["exclude"].items()},
                 emit=emit, on_event=write, isolated=True, claims=claims)
    if spec.get("finals"):
        write({"event": "idle"})
        posted = json.loads(Gate(spec["finals"]).read(spec["supervisor"]) or "{}")
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
    ``{"status": "finals", "timings": [...]}`` per entry (`ctbuild.tune.fleet`). None posted
    (every key decided): nothing, not even the device queries below (0.2 s on an H200 host)."""
    if not entries:
        return
    import torch

    from .measuring import Benches
    from .race import race
    device = current_device()
    fp = toolchain_for(store)
    with torch.cuda.device(device.index):
        for e in entries:
            on_event({"event": "start", "entry": e.index})
            cfgs = [Config(c, e.kernel.name) for c in configs.get(e.index, [])]
            bench = Benches(e.kernel, store, fp, device,
                            **_tellers(e.index, opts, on_event)).on_spec(e.workload)
            result = race(cfgs, bench.sample, opts.settings().band) \
                if len(cfgs) > 1 else None
            emit({"entry": e.index, "kernel": e.kernel.name, "status": "finals",
                  "timings": [t.to_json() for t in (result.timings if result else ())],
                  "gpu": device.name})


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, format="ctbuild: %(levelname)s: %(message)s")
    path = wait_for_spec() if sys.argv[1] == "--warm" else sys.argv[1]
    code = _child(path) if path else 0
    # Every event is written and flushed and every record committed to the store: the
    # interpreter's teardown (CUDA's) took 0.5-0.6 s of every tune on an H200 host.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
