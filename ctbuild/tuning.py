"""Measure precompiled candidates on this GPU and record the winners (``ctbuild tune``).

The public entry points:

* `tune_workload(tuned, w, *, store, ...) -> record` -- tune one kernel x workload on the current
  GPU with cuTile's own ``ct.tune.exhaustive_search`` (CUDA graph per sample, L2 flush, warm-ups,
  95% CI convergence, first launch of every candidate in a timed subprocess), fed with kernels
  whose CUBINs come from the cache (`ServedKernel`): nothing is compiled while measuring. ``w``
  holds specs (random inputs are made) or the caller's real tensors (online tuning: the runtime's
  ``CTBUILD_MODE=tune``). In-place arguments (``restore=``) are snapshotted once and restored
  before every sample, accumulators (``reset_to_zero=``) zeroed; afterwards the caller's tensors
  are as after ONE launch of the winner on the original inputs. The record is written to the
  store (unless ``write=False``) and returned.
* `tune_entries(...)` -- the CLI's loop over kernels x workloads, optionally supervised in a
  child process (`run_isolated`) so that a candidate that kills its CUDA context costs only
  that kernel x workload's measurement, retried without the culprit.
* `CompilePool` -- ``--compile-missing``: compile absent CUBINs in a local process pool while
  measuring; candidates are measured in arrival order.
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import json
import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

from .arch import Arch
from .declare import DEFAULT_CAP, TunedKernel
from .keys import tuning_record_key
from .plan import job_for
from .space import Config
from .specs import Workload, describe, spec_to_json
from .workload_inputs import has_specs, make_inputs, specs_of

log = logging.getLogger("ctbuild")

RECORD_FORMAT = 1


# ---- identity of the GPU and toolchain ------------------------------------------------------
@dataclass(frozen=True)
class Device:
    """The GPU being tuned on."""
    index: int
    arch: str
    name: str
    driver: str

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "arch": self.arch, "gpu": self.name, "driver": self.driver}


def current_device(index: int | None = None) -> Device:
    import torch
    if not torch.cuda.is_available():
        raise RuntimeError("ctbuild tune needs a CUDA GPU; none is visible to torch")
    dev = torch.cuda.current_device() if index is None else index
    major, minor = torch.cuda.get_device_capability(dev)
    return Device(dev, f"sm_{major}{minor}", torch.cuda.get_device_name(dev), driver_version())


def driver_version() -> str:
    try:
        from cuda.tile._cext import get_driver_version  # type: ignore[attr-defined]
        v = int(get_driver_version())
        return f"{v // 1000}.{(v % 1000) // 10}"
    except Exception:
        pass
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20).stdout.strip()
        return out.splitlines()[0] if out else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def toolchain_for(store: Any) -> str:
    """The build's toolchain fingerprint recorded in the cache, else the local compiler's."""
    from .toolchain import probe, select_recorded
    fp = select_recorded(store.toolchains())
    return fp if fp else probe().fingerprint


def record_key(tuned: TunedKernel, w: Mapping[str, Any], device: Device, toolchain_fp: str
               ) -> str:
    return tuning_record_key(kernel_fp=tuned.fingerprint, tuning_key=tuned.tuning_key(
        Workload(dict(w))), arch=device.arch, gpu=device.name, toolchain_fp=toolchain_fp)


# ---- counting compiles -------------------------------------------------------------------
class CompileCounter:
    """Counts in-process tileiras runs (``cuda.tile._compile.compile_tile``) while active,
    plus `STATS.jit_compiles` of served kernels."""

    def __init__(self) -> None:
        self.tileiras = 0
        self._jit0 = 0
        self.jit = 0

    @contextlib.contextmanager
    def active(self) -> Iterator["CompileCounter"]:
        import cuda.tile._compile as cc
        from .served import STATS
        original = cc.compile_tile

        def counting(*args: Any, **kwargs: Any) -> Any:
            self.tileiras += 1
            return original(*args, **kwargs)

        cc.compile_tile = counting
        self._jit0 = STATS.jit_compiles
        try:
            yield self
        finally:
            cc.compile_tile = original
            self.jit += STATS.jit_compiles - self._jit0

    @property
    def total(self) -> int:
        return self.tileiras + self.jit


# ---- compiling missing candidates (--compile-missing) ----------------------------------------
def _pool_init(paths: list[str]) -> None:
    for p in reversed(paths):
        if p not in sys.path:
            sys.path.insert(0, p)
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")  # compile workers never touch the GPU


def _pool_compile(job: dict[str, Any], timeout_sec: float | None) -> dict[str, Any]:
    from .compiler import compile_job
    return compile_job(job, timeout_sec=timeout_sec)


class CompilePool:
    """A local process pool compiling jobs with `ctbuild.compiler.compile_job` (no Ray).

    ``submit`` is idempotent per compile key; ``arrivals(keys)`` yields keys as their CUBINs land
    in the store (already-present ones first), and records failures in ``errors``.
    """

    def __init__(self, store: Any, *, workers: int | None = None, paths: Sequence[str] = (),
                 timeout_sec: float | None = None) -> None:
        import multiprocessing as mp
        self.store = store
        self.timeout_sec = timeout_sec
        n = workers or max(1, min(16, (os.cpu_count() or 2) - 1))
        self.executor = ProcessPoolExecutor(
            max_workers=n, mp_context=mp.get_context("spawn"), initializer=_pool_init,
            initargs=([str(p) for p in paths] or list(sys.path[:1]),))
        self.futures: dict[str, Future] = {}
        self.errors: dict[str, str] = {}
        self.compiled: set[str] = set()
        self.seconds = 0.0
        self._toolchain_recorded = False

    def submit(self, job: Any) -> None:
        if job.key in self.futures or self.store.has_compile(job.key):
            return
        self.futures[job.key] = self.executor.submit(_pool_compile, job.to_json(),
                                                     self.timeout_sec)

    def _land(self, key: str) -> bool:
        fut = self.futures[key]
        if key in self.compiled:
            return True
        if key in self.errors:
            return False
        try:
            out = fut.result()
        except Exception as exc:  # noqa: BLE001 - any compile failure is a per-candidate result
            self.errors[key] = f"{type(exc).__name__}: {exc}".strip()
            return False
        self.store.put_compile(key, out["cubin"], symbol=out["symbol"],
                               meta={"compiled_by": "ctbuild tune --compile-missing",
                                     "seconds": out["seconds"], "toolchain": out["toolchain"]})
        self.seconds += out["seconds"]
        self.compiled.add(key)
        if not self._toolchain_recorded:
            self._toolchain_recorded = True
            with contextlib.suppress(Exception):
                from .toolchain import host_description, probe
                tc = probe()
                if tc.fingerprint not in self.store.toolchains():
                    self.store.put_toolchain(tc.fingerprint, {
                        **tc.profile, "host": host_description(),
                        "created": _dt.datetime.now(_dt.timezone.utc).isoformat()})
        return True

    def arrivals(self, keys: Iterable[str]) -> Iterator[str]:
        keys = list(dict.fromkeys(keys))
        pending = []
        for k in keys:
            if k in self.futures:
                pending.append(k)
            elif self.store.has_compile(k):
                yield k
            else:
                self.errors[k] = "not submitted for compilation"  # pragma: no cover
        by_future = {self.futures[k]: k for k in pending}
        for fut in as_completed(by_future):
            k = by_future[fut]
            if self._land(k):
                yield k

    def close(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)


# ---- in-place arguments ------------------------------------------------------------------
class InPlace:
    """Snapshot ``restore=`` arguments once; before every sample restore them and zero the
    ``reset_to_zero=`` ones. Restoring writes into the caller's own tensors (same pointers, so
    the launch signature and compile key do not change)."""

    def __init__(self, tuned: TunedKernel, w: Workload) -> None:
        self.restore = {n: w[n] for n in tuned.restore}
        self.zero = {n: w[n] for n in tuned.reset_to_zero}
        self.snapshot = {n: t.clone() for n, t in self.restore.items()}

    def __bool__(self) -> bool:
        return bool(self.restore or self.zero)

    def prepare(self) -> None:
        for n, t in self.restore.items():
            t.copy_(self.snapshot[n])
        for t in self.zero.values():
            t.zero_()


# ---- one kernel x workload -----------------------------------------------------------------
def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def tune_workload(tuned: TunedKernel, w: Mapping[str, Any], *, store: Any,
                  toolchain_fp: str | None = None, device: Device | None = None,
                  cap: int = DEFAULT_CAP, timeout_s: float | None = 10.0,
                  configs: Sequence[Config] | None = None, exclude: Mapping[str, str] | None = None,
                  pool: CompilePool | None = None, write: bool = True, seed: int = 0,
                  on_candidate: Callable[[Config], None] | None = None,
                  stream: Any = None, input_device: Any = None) -> dict[str, Any]:
    """Tune one kernel x workload on this GPU from cached CUBINs; return (and store) the record.

    Args:
        tuned: the declared kernel.
        w: its call arguments by name: specs (``Tensor``/``Scalar``; random inputs, or the
            kernel's ``inputs`` hook) or real CUDA tensors (online tuning; left as after one
            launch of the winner).
        store: a ``cache.Store``; CUBINs are read from it, the record written to it.
        toolchain_fp: the toolchain the CUBINs were built with (default: `toolchain_for`).
        device: the GPU (default: torch's current device).
        cap: the project's candidate cap.
        timeout_s: per-launch timeout of the first launch of each candidate (run in cuTile's
            benchmark subprocess, which also contains faults); None: no subprocess.
        configs: measure these configs instead of ``tuned.candidates(...).kept``.
        exclude: {json config: reason} recorded as failures without launching them.
        pool: compile absent CUBINs here (pipelined); without it they are reported missing.
        write: put the record in the store.
        on_candidate: called with each config before its first launch (progress/supervision).
        stream, input_device: where to launch and allocate (default: the device's current
            torch stream, ``cuda:<index>``).

    Returns the record (see the module doc); ``record["config"]`` is None when no candidate
    could be measured, and such a record is not written.
    """
    import torch
    import cuda.tile as ct
    from .served import CubinSource, ServedKernel

    started = time.perf_counter()
    device = device or current_device()
    fp = toolchain_fp or toolchain_for(store)
    real = has_specs(w) is False and len(w) > 0
    spec = specs_of(w) if real else Workload(dict(w))
    arch = Arch(device.arch)
    cands = tuned.candidates(spec, arch, cap)
    space = list(configs) if configs is not None else list(cands.kept)
    default = cands.default
    exclude = dict(exclude or {})

    failures: list[dict[str, Any]] = []
    keys: dict[Config, str] = {}
    for cfg in space:
        try:
            keys[cfg] = job_for(tuned, cfg, spec, device.arch, fp).key
        except Exception as exc:  # noqa: BLE001 - a config that cannot be planned fails alone
            failures.append({"config": cfg.to_json(), "error": f"plan: {exc}"})
    measurable = []
    for cfg in keys:
        reason = exclude.get(json.dumps(cfg.to_json(), sort_keys=True))
        if reason:
            failures.append({"config": cfg.to_json(), "error": reason})
        else:
            measurable.append(cfg)

    missing = [c for c in measurable if not store.has_compile(keys[c])]
    compiled: list[str] = []
    if pool is not None:
        for c in missing:
            pool.submit(job_for(tuned, c, spec, device.arch, fp))
        by_key: dict[str, list[Config]] = {}
        for c in measurable:
            by_key.setdefault(keys[c], []).append(c)

        def order() -> Iterator[Config]:
            for k in pool.arrivals(keys[c] for c in measurable):
                yield from by_key[k]
        missing_set = set()
    else:
        missing_set = set(missing)
        for c in missing:
            failures.append({"config": c.to_json(), "error": "missing: no CUBIN in the cache "
                             f"(compile key {keys[c]}); run ctbuild precompile or pass "
                             "--compile-missing"})

        def order() -> Iterator[Config]:
            yield from (c for c in measurable if c not in missing_set)

    inputs = Workload(dict(w)) if real else make_inputs(
        tuned, spec, input_device or f"cuda:{device.index}", seed)
    inplace = InPlace(tuned, inputs)
    source = CubinSource(store, fp)
    served: dict[Config, Any] = {}

    last: list[Config | None] = [None]

    def kernel_for(cfg: Config) -> Any:
        if cfg not in served:
            served[cfg] = ServedKernel(tuned, cfg, source)
        return served[cfg]

    def args_for(cfg: Config) -> tuple:
        if on_candidate is not None and cfg != last[0]:
            last[0] = cfg
            on_candidate(cfg)  # before every launch of a new candidate: who to blame on a crash
        if inplace:
            inplace.prepare()
        return tuned.kernel_args(cfg, inputs)

    class _Lazy(Sequence):
        """exhaustive_search iterates its space once; yield configs as their CUBINs arrive."""
        def __init__(self, n: int) -> None:
            self.n = n

        def __len__(self) -> int:
            return self.n

        def __getitem__(self, i: int) -> Config:  # pragma: no cover - not used by the tuner
            raise IndexError(i)

        def __iter__(self) -> Iterator[Config]:
            return order()

    stream = stream if stream is not None else torch.cuda.current_stream(device.index)
    counter = CompileCounter()
    result = None
    search_error = None
    n_measure = len(measurable) - len(missing_set)
    t_measure = time.perf_counter()
    on_gpu = torch.cuda.is_available()
    with (torch.cuda.device(device.index) if on_gpu else contextlib.nullcontext()), \
            counter.active():
        if n_measure > 0:
            try:
                result = ct.tune.exhaustive_search(
                    _Lazy(n_measure), stream, lambda cfg: tuned.grid(cfg, inputs), kernel_for,
                    args_for, None, quiet=True, single_run_timeout_sec=timeout_s)
            except Exception as exc:  # noqa: BLE001 - every candidate failed (ValueError)
                search_error = f"{type(exc).__name__}: {exc}"
        measure_s = time.perf_counter() - t_measure
        if pool is not None:
            compiled = [keys[c] for c in measurable if keys[c] in pool.compiled]
            for c in measurable:
                if keys[c] in pool.errors:
                    failures.append({"config": c.to_json(),
                                     "error": f"compile: {pool.errors[keys[c]]}"})
        if result is not None:
            for cfg, etype, msg in result.failures:
                failures.append({"config": cfg.to_json(), "error": _explain(etype, msg)})
        elif search_error is not None:
            # exhaustive_search raises with the first failure only; rerun would be wasteful,
            # so record every measurable config as failed with that message.
            for c in measurable:
                if c not in missing_set and not any(f["config"] == c.to_json() for f in failures):
                    failures.append({"config": c.to_json(), "error": search_error})

        winner = None
        if result is not None:
            winner = result.best.config
            # Leave the caller-visible tensors as after one clean launch of the winner.
            inplace.prepare()
            ct.launch(stream, tuned.grid(winner, inputs), served[winner],
                      tuned.kernel_args(winner, inputs))
            stream.synchronize()

    measurements = sorted(result.successes, key=lambda m: m.mean_us) if result else []
    by_cfg = {m.config: m for m in measurements}
    dflt = by_cfg.get(default)
    record: dict[str, Any] = {
        "format": RECORD_FORMAT,
        "kernel": tuned.name,
        "module": tuned.module,
        "kernel_fp": tuned.fingerprint,
        "arch": device.arch,
        "gpu": device.name,
        "driver": device.driver,
        "toolchain": fp,
        "tuning_key": tuned.tuning_key(spec),
        "workload": {n: spec_to_json(v) for n, v in spec.items()},
        "config": winner.to_json() if winner is not None else None,
        "compile_key": keys.get(winner) if winner is not None else None,
        "mean_us": result.best.mean_us if result else None,
        "ci_us": result.best.error_margin_us if result else None,
        "default": {"config": default.to_json(), "mean_us": dflt.mean_us if dflt else None,
                    "ci_us": dflt.error_margin_us if dflt else None},
        "candidates": [{"config": m.config.to_json(), "mean_us": m.mean_us,
                        "ci_us": m.error_margin_us, "samples": m.num_samples}
                       for m in measurements],
        "failures": failures,
        "space": {"total": cands.total, "pruned": len(cands.pruned), "kept": len(space)},
        "compiled_during_tune": len(compiled),
        "compiles_during_measurement": counter.total,
        "measure_seconds": round(measure_s, 3),
        "seconds": round(time.perf_counter() - started, 3),
        "source": "online" if real else "workload",
        "tuned_at": _now(),
    }
    if write and winner is not None:
        store.put_tuning(record_key(tuned, spec, device, fp), record)
    return record


def _explain(etype: type, msg: str) -> str:
    text = f"{etype.__name__}: {msg.strip()}"
    if "benchmark worker exited unexpectedly" in msg:
        return ("fault: the candidate's first launch killed cuTile's benchmark subprocess "
                "(illegal address, trap or abort; its stderr has the CUDA error) -- " + text)
    if etype.__name__ == "TileLaunchTimeoutError":
        return "timeout: " + text
    return text


def context_ok() -> bool:
    """Whether this process's CUDA context still works (a fault makes it sticky-broken)."""
    import torch
    try:
        torch.cuda.synchronize()
        torch.zeros(1, device="cuda").add_(1).item()
        return True
    except Exception:  # noqa: BLE001
        return False


# ---- many kernels x workloads ------------------------------------------------------------------
@dataclass
class Entry:
    """One kernel x workload to tune."""
    kernel: TunedKernel
    workload: Workload
    index: int

    @property
    def label(self) -> str:
        return f"{self.kernel.name} [{describe(self.workload)}]"


def entries_for(kernels: Sequence[TunedKernel], only: Sequence[str] = ()) -> list[Entry]:
    out = []
    for k in kernels:
        if only and k.name not in only:
            continue
        for w in k.workloads:
            out.append(Entry(k, w, len(out)))
    return out


def summarize(entry: Entry, status: str, record: dict[str, Any] | None, rkey: str,
              note: str = "") -> dict[str, Any]:
    """The CLI's per-entry line (and ``--json`` item); the full record rides along."""
    s: dict[str, Any] = {"entry": entry.index, "kernel": entry.kernel.name,
                         "workload": describe(entry.workload), "record_key": rkey,
                         "status": status}
    if note:
        s["note"] = note
    if record:
        dflt = record.get("default", {})
        s.update({
            "winner": record.get("config"), "mean_us": record.get("mean_us"),
            "ci_us": record.get("ci_us"), "default": dflt.get("config"),
            "default_us": dflt.get("mean_us"),
            "speedup_vs_default": (dflt["mean_us"] / record["mean_us"]
                                   if dflt.get("mean_us") and record.get("mean_us") else None),
            "measured": len(record.get("candidates", [])),
            "failures": record.get("failures", []),
            "compiled_during_tune": record.get("compiled_during_tune", 0),
            "compiles_during_measurement": record.get("compiles_during_measurement", 0),
            "seconds": record.get("seconds"), "record": record})
    return s


@dataclass
class TuneOptions:
    retune: bool = False
    compile_missing: bool = False
    timeout_s: float | None = 10.0
    cap: int = DEFAULT_CAP
    paths: list[str] = field(default_factory=list)
    workers: int | None = None


def tune_entries(entries: Sequence[Entry], store: Any, opts: TuneOptions, *,
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
    todo: list[Entry] = []
    for e in entries:
        rkey = record_key(e.kernel, e.workload, device, fp)
        existing = None if opts.retune else store.get_tuning(rkey)
        if existing is not None:
            s = summarize(e, "skipped", existing, rkey, "already tuned (use --retune)")
            out.append(s)
            if emit:
                emit(s)
        else:
            todo.append(e)
    pool = None
    if opts.compile_missing and todo:
        pool = CompilePool(store, workers=opts.workers, paths=opts.paths)
        for e in todo:
            with contextlib.suppress(Exception):
                for cfg in e.kernel.candidates(e.workload, Arch(device.arch), opts.cap).kept:
                    pool.submit(job_for(e.kernel, cfg, e.workload, device.arch, fp))
    try:
        for e in todo:
            rkey = record_key(e.kernel, e.workload, device, fp)
            if on_event:
                on_event({"event": "start", "entry": e.index})
            cb = (lambda cfg, _i=e.index: on_event({"event": "candidate", "entry": _i,
                                                    "config": cfg.to_json()})) \
                if on_event else None
            try:
                record = tune_workload(e.kernel, e.workload, store=store, toolchain_fp=fp,
                                       device=device, cap=opts.cap, timeout_s=opts.timeout_s,
                                       exclude=(exclude or {}).get(e.index), pool=pool,
                                       on_candidate=cb, **workload_kwargs)
                status = "tuned" if record["config"] is not None else "failed"
                s = summarize(e, status, record, rkey,
                              "" if status == "tuned" else "no candidate could be measured")
            except Exception as exc:  # noqa: BLE001 - one entry's error never stops the run
                log.debug("tuning %s failed", e.label, exc_info=True)
                s = summarize(e, "failed", None, rkey, f"{type(exc).__name__}: {exc}")
                s["traceback"] = traceback.format_exc(limit=8)
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


# ---- supervision: a child process per run, restarted without the culprit -------------------
def run_isolated(config_path: str | None, cache_dir: str, entries: Sequence[Entry],
                 opts: TuneOptions, *, only: Sequence[str] = (), entry_timeout_s: float | None = None,
                 max_restarts: int = 8,
                 emit: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """Run `tune_entries` in a child process; if it dies (a fault that escaped cuTile's
    benchmark subprocess) or stalls, restart it on the remaining entries, excluding the
    candidate that was being measured (recorded as a failure of that entry).
    """
    results: dict[int, dict[str, Any]] = {}
    exclude: dict[int, dict[str, str]] = {}
    remaining = [e.index for e in entries]
    restarts = 0
    per_entry = entry_timeout_s or _entry_budget(opts)
    with tempfile.TemporaryDirectory(prefix="ctbuild-tune-") as tmp:
        while remaining:
            events_path = Path(tmp) / f"events-{restarts}.jsonl"
            spec = {"config": config_path, "cache": cache_dir, "entries": remaining,
                    "only": list(only), "exclude": {str(k): v for k, v in exclude.items()},
                    "opts": {**opts.__dict__}, "events": str(events_path)}
            spec_path = Path(tmp) / f"spec-{restarts}.json"
            spec_path.write_text(json.dumps(spec))
            proc = subprocess.Popen([sys.executable, "-m", "ctbuild.tuning", str(spec_path)],
                                    stdout=sys.stderr)
            current: int | None = None
            last_cfg: dict[str, Any] | None = None
            started = time.monotonic()
            seen = 0
            stalled = False
            while True:
                rc = proc.poll()
                for ev in _read_events(events_path, seen):
                    seen += 1
                    if ev["event"] == "start":
                        current, last_cfg, started = ev["entry"], None, time.monotonic()
                    elif ev["event"] == "candidate":
                        last_cfg = ev["config"]
                    elif ev["event"] == "done":
                        s = ev["summary"]
                        results[ev["entry"]] = s
                        if ev["entry"] in remaining:
                            remaining.remove(ev["entry"])
                        current = None
                        if emit:
                            emit(s)
                if rc is not None:
                    break
                if current is not None and time.monotonic() - started > per_entry:
                    stalled = True
                    proc.kill()
                    proc.wait()
                    break
                time.sleep(0.2)
            if not remaining:
                break
            restarts += 1
            why = ("stalled (killed after %.0f s)" % per_entry if stalled
                   else f"tuning process died (exit {proc.returncode})")
            culprit = current if current is not None else remaining[0]
            if last_cfg is not None and restarts <= max_restarts:
                key = json.dumps(last_cfg, sort_keys=True)
                exclude.setdefault(culprit, {})[key] = (
                    f"process: {why} while measuring this candidate")
                continue
            # Nothing to blame inside the entry (or too many restarts): fail the entry.
            e = next(x for x in entries if x.index == culprit)
            s = summarize(e, "failed", None, "", why)
            results[culprit] = s
            remaining.remove(culprit)
            if emit:
                emit(s)
    return [results[e.index] for e in entries if e.index in results]


def _entry_budget(opts: TuneOptions) -> float:
    # exhaustive_search stops measuring a candidate after ~5 s; add warm-ups and compile waits.
    per_candidate = 6.0 + 2 * (opts.timeout_s or 10.0)
    return 120.0 + per_candidate * opts.cap + (600.0 if opts.compile_missing else 0.0)


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
    """The supervised tuning process (``python -m ctbuild.tuning SPEC``)."""
    spec = json.loads(Path(spec_path).read_text())
    from cache import Store
    from .config import load_project
    project = load_project(spec["config"], cache_dir=spec["cache"])
    entries = entries_for(project.kernels(), spec["only"])
    wanted = set(spec["entries"])
    entries = [e for e in entries if e.index in wanted]
    opts = TuneOptions(**spec["opts"])
    events = open(spec["events"], "a", buffering=1)
    lock = threading.Lock()

    def write(ev: dict[str, Any]) -> None:
        with lock:
            events.write(json.dumps(ev, default=str) + "\n")
            events.flush()

    def emit(s: dict[str, Any]) -> None:
        write({"event": "done", "entry": s["entry"], "summary": s})

    store = Store(spec["cache"])
    tune_entries(entries, store, opts, exclude={int(k): v for k, v in spec["exclude"].items()},
                 emit=emit, on_event=write, isolated=True)
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, format="ctbuild: %(levelname)s: %(message)s")
    sys.exit(_child(sys.argv[1]))
