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
The CLI's loop over kernels x workloads lives in `ctbuild.tune.session`, the
``--compile-missing`` pool in `ctbuild.build.compile_pool`.
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import json
import logging
import subprocess
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, Sequence

from .. import cutile
from ..arch import Arch
from ..build.compile_pool import CompilePool
from ..build.plan import job_for
from ..declare import DEFAULT_CAP, TunedKernel
from ..device_table import cuda_device, nominal_device
from ..keys import kernel_record_key
from ..records import TuningRecord
from ..space import Config
from ..specs import Workload, spec_to_json
from ..toolchain import toolchain_for
from .inputs import has_specs, make_inputs, specs_of

if TYPE_CHECKING:
    from cache import Store

    from ..serve.served_kernel import ServedKernel

log = logging.getLogger("ctbuild")


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
    return Device(dev, str(Arch.from_capability(major, minor)), torch.cuda.get_device_name(dev),
                  driver_version())


def driver_version() -> str:
    try:
        v = cutile.driver_version()
        return f"{v // 1000}.{(v % 1000) // 10}"
    except Exception:
        pass
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20).stdout.strip()
        return out.splitlines()[0] if out else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def record_key(tuned: TunedKernel, w: Mapping[str, Any], device: Device, toolchain_fp: str
               ) -> str:
    return kernel_record_key(tuned, Workload(dict(w)), device.arch, device.name, toolchain_fp)


# ---- counting compiles -------------------------------------------------------------------
class CompileCounter:
    """Counts cuTile compiles of this thread while active (`cutile.compiles_in_this_thread`:
    a compile in another thread of the process is not this tuning's), plus `STATS.jit_compiles`
    of served kernels."""

    def __init__(self) -> None:
        self.tileiras = 0
        self._jit0 = 0
        self.jit = 0

    @contextlib.contextmanager
    def active(self) -> Iterator[CompileCounter]:
        from ..serve.served_kernel import STATS
        tileiras0 = cutile.compiles_in_this_thread()
        self._jit0 = STATS.jit_compiles
        try:
            yield self
        finally:
            self.tileiras += cutile.compiles_in_this_thread() - tileiras0
            self.jit += STATS.jit_compiles - self._jit0

    @property
    def total(self) -> int:
        return self.tileiras + self.jit


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
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


def tune_workload(tuned: TunedKernel, w: Mapping[str, Any], *, store: Store | None,
                  toolchain_fp: str | None = None, device: Device | None = None,
                  cap: int = DEFAULT_CAP, timeout_s: float | None = 10.0,
                  configs: Sequence[Config] | None = None, exclude: Mapping[str, str] | None = None,
                  pool: CompilePool | None = None, write: bool = True, seed: int = 0,
                  on_candidate: Callable[[Config], None] | None = None,
                  stream: Any = None, input_device: Any = None,
                  served: Callable[[Config], ServedKernel] | None = None) -> dict[str, Any]:
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
        served: the kernel object to launch per config (default: a `ServedKernel` reading
            ``store``). The runtime passes its own, which JIT-compiles a missing CUBIN under its
            miss policy; then no candidate is reported missing. ``store`` may then be None
            (nothing is read from or written to it).

    Returns the record as stored (`ctbuild.records.TuningRecord.to_json`; read it back with
    ``TuningRecord.from_json``); its ``config`` is None when no candidate could be measured,
    and such a record is not written.
    """
    import cuda.tile as ct
    import torch

    from ..serve.served_kernel import CubinSource, ServedKernel

    started = time.perf_counter()
    device = device or current_device()
    fp = toolchain_fp or (toolchain_for(store) if store is not None else "")
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

    if served is None and store is None:
        raise ValueError("tune_workload needs a store to read CUBINs from, or served=")
    missing = [] if served is not None or store is None else [
        c for c in measurable if not store.has_compile(keys[c])]
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
    kernels: dict[Config, ServedKernel] = {}

    last: list[Config | None] = [None]

    def kernel_for(cfg: Config) -> ServedKernel:
        if cfg not in kernels:
            kernels[cfg] = served(cfg) if served is not None else ServedKernel(tuned, cfg, source)
        return kernels[cfg]

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

        def __getitem__(self, i: int) -> Config:  # type: ignore[override]  # never used
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
    grid_dev = cuda_device(device.index) if on_gpu else nominal_device(device.arch)
    with (torch.cuda.device(device.index) if on_gpu else contextlib.nullcontext()), \
            counter.active():
        if n_measure > 0:
            try:
                result = ct.tune.exhaustive_search(
                    _Lazy(n_measure), stream, lambda cfg: tuned.grid(cfg, inputs, grid_dev), kernel_for,
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
            ct.launch(stream, tuned.grid(winner, inputs, grid_dev), kernel_for(winner),
                      tuned.kernel_args(winner, inputs))
            stream.synchronize()

    measurements = sorted(result.successes, key=lambda m: m.mean_us) if result else []
    by_cfg = {m.config: m for m in measurements}
    dflt = by_cfg.get(default)
    record = TuningRecord(
        kernel=tuned.name,
        module=tuned.module,
        kernel_fp=tuned.fingerprint,
        arch=device.arch,
        gpu=device.name,
        driver=device.driver,
        toolchain=fp,
        tuning_key=tuned.tuning_key(spec),
        workload={n: spec_to_json(v) for n, v in spec.items()},
        config=winner.to_json() if winner is not None else None,
        compile_key=keys.get(winner) if winner is not None else None,
        mean_us=result.best.mean_us if result else None,
        ci_us=result.best.error_margin_us if result else None,
        default={"config": default.to_json(), "mean_us": dflt.mean_us if dflt else None,
                 "ci_us": dflt.error_margin_us if dflt else None},
        candidates=[{"config": m.config.to_json(), "mean_us": m.mean_us,
                     "ci_us": m.error_margin_us, "samples": m.num_samples}
                    for m in measurements],
        failures=failures,
        space={"total": cands.total, "pruned": len(cands.pruned), "kept": len(space)},
        compiled_during_tune=len(compiled),
        compiles_during_measurement=counter.total,
        measure_seconds=round(measure_s, 3),
        seconds=round(time.perf_counter() - started, 3),
        source="online" if real else "workload",
        tuned_at=_now(),
    ).to_json()
    if write and winner is not None and store is not None:
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
