"""Warm-start runtime: launch declared kernels with tuned configs and CUBINs from the cache.

``matmul(a, b, c)`` (current torch stream) or ``matmul.launch(stream, a, b, c)``:

1. Hot path: one flat key (per tensor: shape, strides, dtype, pointer % 16, and the device when
   several GPUs are visible; per scalar: type and value), computed by a function generated for
   the call's argument kinds (`live_args.make_key_fn`), looks up a resolved entry (grid,
   `ServedKernel`, the constant tail of the kernel arguments) and calls ``ct.launch``. No
   Workload, no declared key/grid/args function, no cache access, no lock.
2. Slow path (first call per key, under a per-kernel lock): bind the arguments, compute
   the tuning key, find the winner — memory, then the cache's tuning record for this GPU, then
   the default config (or the miss policy, ``CTBUILD_MODE``) — derive the compile key to know
   whether the CUBIN is cached, build the entry, launch once, publish the entry.

One `ServedKernel` per config per kernel, created once; its CUBINs come from the cache through
`CubinSource` (no tileiras). cuTile's dispatcher keeps its own per-kernel-object cache, so a
CUBIN is loaded once per signature. Importing this module imports neither Ray nor the farm.
"""
from __future__ import annotations

import json
import logging
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import cuda.tile as ct

from ..arch import Arch
from ..device_table import DeviceInfo, cuda_device, nominal_device
from ..dims import find_bucket
from ..keys import record_key_for
from ..signature import derive_signature
from ..space import Config
from ..specs import Workload
from .context import RuntimeContext, _Pending, configure, context, reset, stats
from .live_args import device_of, make_key_fn, workload_spec
from .miss_policy import (
    CacheMissError,
    RuntimeConfigError,
    cubin_miss_message,
    tuning_miss_message,
    workload_json,
)
from .served_kernel import LAST_SERVED, ServedKernel, check_cutile

check_cutile()  # fail loudly at import if cuda-tile's private launch interface changed

log = logging.getLogger("ctbuild.runtime")

__all__ = ["KernelRuntime", "RuntimeContext", "CacheMissError", "KernelCallError",
           "RuntimeConfigError", "configure", "context", "reset", "stats"]

#: Where a launch's config came from -> the provenance label (unless its CUBIN was JIT-compiled).
#: ``fallback``: the winner had no CUBIN covering the call, the default config's generic one did.
ORIGIN_OF_CONFIG = {"cache": "cache", "memory": "cache", "default": "default",
                    "disabled": "default", "online": "tuned", "fallback": "default"}
ORIGINS = ("cache", "default", "tuned", "jit")
#: What served a launch's CUBIN: a signature class of the cache, or a compile (``miss``).
CUBIN_CLASSES = ("exact", "relaxed", "generic", "miss")
#: Drop the hot-path memo of a kernel when it grows past this (e.g. a scalar that varies).
MAX_FAST_ENTRIES = 4096


class KernelCallError(RuntimeError):
    """A call of a declared kernel failed; the message names the kernel first."""


# ---- per-kernel runtime ----------------------------------------------------------------------
@dataclass
class Resolved:
    """What one call resolves to (the slow path's result; also usable without a GPU)."""
    config: Config
    config_from: str            # cache | memory | default | disabled | online | fallback
    cubin_from: str             # cache | jit (expected; corrected if the launch JIT-compiles)
    cubin_class: str            # exact | relaxed | generic | miss (expected, like cubin_from)
    bucket: dict[str, int] | None
    arch: str
    gpu: str
    device: int
    tuning_key: list
    record_key: str | None
    compile_key: str | None
    grid: tuple[int, ...]
    kernel_args: tuple
    served: ServedKernel
    workload: Workload
    workload_json: dict[str, Any]


class _Entry:
    """A resolved hot-path entry; ``hot`` is what the hot path unpacks in one go."""
    __slots__ = ("grid", "kernel", "tail", "recipe", "device", "zero", "calls", "info", "hot")

    def __init__(self, grid: tuple, kernel: ServedKernel, tail: tuple | None,
                 recipe: tuple | None, device: int, zero: tuple, info: dict) -> None:
        self.grid, self.kernel, self.tail, self.recipe = grid, kernel, tail, recipe
        self.device, self.zero, self.calls, self.info = device, zero, 0, info
        self.hot = (grid, kernel, tail, device, zero, self)

    def build(self, args: tuple) -> tuple:
        if self.tail is not None:
            return args + self.tail
        return tuple([args[v] if is_arg else v for is_arg, v in self.recipe])  # type: ignore


def _recipe(call_args: tuple, kernel_args: tuple) -> tuple[tuple | None, tuple | None]:
    """How to rebuild the kernel arguments from the call arguments on the hot path.

    Each kernel argument is either one of the call arguments (by identity) or a plain constant
    (derived from shapes/values that the token covers). Returns (tail, None) when the kernel
    arguments are the call arguments followed by constants, else (None, recipe); (None, None)
    when some argument is neither (e.g. a new tensor view): then the args function runs per call.
    """
    recipe = []
    for value in kernel_args:
        idx = next((i for i, a in enumerate(call_args) if a is value), None)
        if idx is not None:
            recipe.append((True, idx))
        elif _plain(value):
            recipe.append((False, value))
        else:
            return None, None
    n = len(call_args)
    if len(recipe) >= n and all(r == (True, i) for i, r in enumerate(recipe[:n])) and \
            not any(is_arg for is_arg, _ in recipe[n:]):
        return tuple(v for _, v in recipe[n:]), None
    return None, tuple(recipe)


def _plain(value: Any) -> bool:
    if isinstance(value, tuple):
        return all(_plain(v) for v in value)
    return value is None or type(value) in (bool, int, float, str)


def _torch_stream(stream: Any, device: int) -> Any:
    """A torch stream object for ``stream`` (None: the device's current stream)."""
    import torch
    if stream is None:
        return torch.cuda.current_stream(device)
    if isinstance(stream, torch.cuda.Stream):
        return stream
    handle = stream if isinstance(stream, int) else getattr(stream, "cuda_stream", None)
    if handle is None:
        raise KernelCallError(f"cannot use {stream!r} as a CUDA stream")
    return torch.cuda.ExternalStream(int(handle), device=device)


def _no_key(*args: Any) -> tuple:
    raise KeyError("no key function yet")


def _visible_gpus() -> int:
    """CUDA devices torch sees (with one, the device index is left out of hot-path keys)."""
    try:
        import torch
        return torch.cuda.device_count()
    except Exception:
        return 0


def _raw_stream_fn() -> Any:
    import torch
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return raw
    return lambda device: torch.cuda.current_stream(device)


class KernelRuntime:
    """Launches one declared kernel (`TunedKernel`) warm from the cache."""

    def __init__(self, tuned: Any, ctx: RuntimeContext | None = None) -> None:
        self.tuned = tuned
        self.name = tuned.name
        self.ctx = ctx or context()
        self._fast: dict[tuple, _Entry] = {}
        self._entries: list[_Entry] = []
        self._served: dict[Config, ServedKernel] = {}
        self._winners: dict[tuple, tuple[Config, str]] = {}
        self._lock = threading.RLock()
        self._zero_idx = tuple(tuned.params.index(n) for n in tuned.reset_to_zero)
        self._stream_of: Any = _raw_stream_fn()
        self._multi_gpu = _visible_gpus() != 1
        self._key: Any = _no_key
        self._space: list[Config] | None = None
        self._devices: dict[int, DeviceInfo] = {}

    def __repr__(self) -> str:
        return f"<KernelRuntime {self.name} mode={self.ctx.mode} entries={len(self._entries)}>"

    # ---- the hot path ----
    def call(self, args: tuple, kwargs: dict) -> None:
        """``kernel(*args, **kwargs)`` on the current torch stream of the tensors' device."""
        if kwargs:
            args = self._positional(args, kwargs)
        try:
            grid, kernel, tail, device, zero, entry = self._fast[self._key(*args)]
        except Exception:  # a new layout (KeyError) or other argument kinds: the slow path
            self._first_call(None, args)
            return
        entry.calls += 1
        if zero:
            for i in zero:
                args[i].zero_()
        try:
            ct.launch(self._stream_of(device), grid, kernel,
                      args + tail if tail is not None else self._args(entry, args))
        except Exception as exc:
            self._reraise(exc)

    def launch(self, stream: Any, args: tuple, kwargs: dict) -> None:
        """``kernel.launch(stream, *args, **kwargs)`` on an explicit stream."""
        if kwargs:
            args = self._positional(args, kwargs)
        try:
            grid, kernel, tail, device, zero, entry = self._fast[self._key(*args)]
        except Exception:
            self._first_call(stream, args)
            return
        entry.calls += 1
        if zero:
            self._zero(stream, args, zero)
        try:
            ct.launch(stream, grid, kernel,
                      args + tail if tail is not None else self._args(entry, args))
        except Exception as exc:
            self._reraise(exc)

    def _memo_key(self, args: tuple) -> tuple | None:
        """The hot-path key of a call; rebuilds the key function when the argument kinds
        changed (then the memo starts over). None when the call cannot be keyed."""
        try:
            return self._key(*args)
        except Exception:
            pass
        try:
            key_fn = make_key_fn(args, with_device=self._multi_gpu)
            key = key_fn(*args)
            hash(key)
        except Exception:
            return None
        self._key = key_fn
        self._fast = {}
        return key

    def _args(self, entry: _Entry, args: tuple) -> tuple:
        if entry.tail is not None or entry.recipe is not None:
            return entry.build(args)
        return self.tuned.kernel_args(entry.info["config_obj"], self.tuned.bind(*args))

    def _positional(self, args: tuple, kwargs: dict) -> tuple:
        w = self.tuned.bind(*args, **kwargs)
        return tuple(w.args[p] for p in self.tuned.params)

    # ---- the slow path ----
    def _first_call(self, stream: Any, args: tuple) -> None:
        with self._lock:
            key = self._memo_key(args)
            hot = self._fast.get(key) if key is not None else None
            if hot is not None:  # another thread resolved it while we waited
                entry = hot[-1]
                entry.calls += 1
                if entry.zero:
                    self._zero(stream, args, entry.zero)
                ct.launch(self._stream(stream, entry.device), entry.grid, entry.kernel,
                          self._args(entry, args))
                return
            try:
                res = self.resolve(args, stream=stream)
            except Exception as exc:
                self._reraise(exc)
            pending = _Pending(res.workload_json, cubin_from=res.cubin_from,
                               cubin_miss_noted=res.cubin_from == "jit")
            self.ctx.pending = pending
            LAST_SERVED.cls = None
            try:
                if self._zero_idx:
                    self._zero(stream, args, self._zero_idx)
                self._launch_first(stream, res)
            except Exception as exc:
                self._reraise(exc)
            finally:
                self.ctx.pending = None
            served_class = getattr(LAST_SERVED, "cls", None) or res.cubin_class
            if pending.cubin_from == "jit" or served_class == "jit":
                served_class = "miss"
            if served_class in ("relaxed", "generic"):  # the next build can add the exact class
                self.ctx.misses.write_record(self.name, res.workload_json, res.arch)
            tail, recipe = _recipe(args, res.kernel_args)
            info = {"tuning_key": res.tuning_key, "arch": res.arch, "gpu": res.gpu,
                    "device": res.device, "config": res.config.to_json(),
                    "config_obj": res.config, "config_from": res.config_from,
                    "cubin_from": pending.cubin_from, "cubin_class": served_class,
                    "bucket": res.bucket, "compile_key": res.compile_key,
                    "workload": res.workload_json, "created": time.time()}
            entry = _Entry(res.grid, res.served, tail, recipe, res.device, self._zero_idx, info)
            entry.calls = 1
            self._entries.append(entry)
            if key is not None:
                if len(self._fast) >= MAX_FAST_ENTRIES:
                    self._fast = {}
                self._fast[key] = entry.hot

    def _launch_first(self, stream: Any, res: "Resolved") -> None:
        try:
            ct.launch(self._stream(stream, res.device), res.grid, res.served, res.kernel_args)
        except TypeError as exc:
            if stream is not None or "stream" not in str(exc).lower():
                raise
            # this cuTile does not take a raw stream handle: use torch stream objects
            import torch
            self._stream_of = torch.cuda.current_stream
            ct.launch(self._stream(None, res.device), res.grid, res.served, res.kernel_args)

    def _stream(self, stream: Any, device: int) -> Any:
        if stream is not None:
            return stream
        return self._stream_of(device)

    def _zero(self, stream: Any, args: tuple, idx: tuple) -> None:
        """Zero the ``reset_to_zero`` arguments on the stream the kernel will run on."""
        if stream is None:
            for i in idx:
                args[i].zero_()
            return
        import torch
        device = next((args[i].get_device() for i in idx), 0)
        with torch.cuda.stream(_torch_stream(stream, device)):
            for i in idx:
                args[i].zero_()

    def resolve(self, args: tuple, kwargs: dict | None = None, *, stream: Any = None,
                arch: str | None = None, gpu: str | None = None, device: int = 0,
                dry: bool = False) -> Resolved:
        """Resolve a call without launching it: the winner, the served kernel, grid, args.

        With ``arch`` (and ``gpu``) given, no CUDA device is consulted (the grid sees the
        arch's nominal device) — this is how CPU tests and `explain` check key computation,
        CUBIN classes, strict-mode errors and miss records on host tensors or specs. ``dry``:
        count nothing, record nothing, raise no miss, tune nothing (`explain`).
        """
        tuned = self.tuned
        with self._lock:
            w = tuned.bind(*args, **(kwargs or {}))
            if arch is None:
                device = self._device_for(w)
                arch, dev_gpu = self.ctx.device_info(device)
                gpu = gpu or dev_gpu
                dev = self._device_facts(device) if tuned._wants_device else None
            else:
                dev = nominal_device(str(Arch(arch))) if tuned._wants_device else None
            arch = str(Arch(arch))
            gpu = gpu or "unknown GPU"
            spec_w = workload_spec(tuned, w)
            wl_json = workload_json(spec_w)
            bucket = find_bucket(tuned.dynamic_workloads, spec_w) \
                if tuned.dynamic_workloads else None
            keys = [tuned.tuning_key(w)]
            if bucket is not None:  # the bucket's record, unless this size was tuned itself
                rep_key = tuned.tuning_key(bucket.representative)
                if rep_key != keys[0]:
                    keys.append(rep_key)
            cfg, config_from, record_key, tk = self._winner(w, keys, arch, gpu, wl_json, stream,
                                                            dry)
            cover = self._cover(cfg, spec_w, arch)
            default = tuned.default_config(w)
            if cover[1] is None and cfg != default:
                fallback = self._cover(default, spec_w, arch)
                if fallback[1] is not None:
                    cfg, config_from, cover = default, "fallback", fallback
            compile_key, cubin_class = cover
            cubin_from = "cache"
            if cubin_class is None:
                cubin_class, cubin_from = "miss", "jit"
                if not dry and compile_key is not None:
                    self._cubin_miss(cfg, compile_key, arch, wl_json)
            served = self.served_kernel(cfg)
            grid = tuned.grid(cfg, w, dev)
            kernel_args = tuned.kernel_args(cfg, w)
            return Resolved(cfg, config_from, cubin_from, cubin_class,
                            bucket.to_json() if bucket is not None else None, arch, gpu, device,
                            tk, record_key, compile_key, grid, kernel_args, served, w, wl_json)

    def explain(self, args: tuple, kwargs: dict | None = None, *, arch: str | None = None,
                gpu: str | None = None) -> dict[str, Any]:
        """`TunedKernel.explain`: what `resolve` decides for a call, as a dict, launching
        nothing, counting and recording nothing."""
        res = self.resolve(args, kwargs, arch=arch, gpu=gpu, dry=True)
        return {"kernel": self.name, "config": res.config.to_json(),
                "config_from": {"memory": "record", "cache": "record"}.get(
                    res.config_from, res.config_from),
                "bucket": res.bucket, "cubin_class": res.cubin_class,
                "compile_key": res.compile_key, "cached": res.cubin_class != "miss",
                "tuning_key": res.tuning_key, "record_key": res.record_key, "arch": res.arch,
                "gpu": res.gpu, "grid": list(res.grid), "mode": self.ctx.mode,
                "workload": res.workload_json}

    def _device_facts(self, device: int) -> DeviceInfo:
        """What ``grid(cfg, w, dev)`` sees of a real GPU (queried once per device)."""
        facts = self._devices.get(device)
        if facts is None:
            facts = self._devices[device] = cuda_device(device)
        return facts

    def _device_for(self, w: Workload) -> int:
        devices = {}
        for name, value in w.items():
            d = device_of(value)
            if d is None:
                continue
            if d < 0:
                where = getattr(getattr(value, "device", None), "type", "host")
                raise KernelCallError(
                    f"kernel {self.name!r}: argument {name!r} is a {where} tensor; ctbuild "
                    "kernels launch on CUDA tensors (move it with .cuda())")
            devices.setdefault(d, name)
        if not devices:
            raise KernelCallError(f"kernel {self.name!r}: no CUDA tensor among the arguments "
                                  f"({', '.join(w)}): cannot tell which GPU to launch on")
        if len(devices) > 1:
            shown = ", ".join(f"{n} on cuda:{d}" for d, n in devices.items())
            raise KernelCallError(f"kernel {self.name!r}: arguments are on different GPUs "
                                  f"({shown}); put them on one device")
        return next(iter(devices))

    def served_kernel(self, cfg: Config) -> ServedKernel:
        """The one `ServedKernel` of a config (created on first use, thread-safe)."""
        served = self._served.get(cfg)
        if served is None:
            with self._lock:
                served = self._served.get(cfg)
                if served is None:
                    served = ServedKernel(self.tuned, cfg, self.ctx.source)
                    self._served[cfg] = served
        return served

    def _in_space(self, cfg: Config) -> bool:
        if self._space is None:
            self._space = [Config(c) for c in self.tuned.space.enumerate()]
        return cfg in self._space

    def _winner(self, w: Workload, keys: list[list], arch: str, gpu: str, wl_json: dict,
                stream: Any, dry: bool = False) -> tuple[Config, str, str | None, list]:
        """(config, where it came from, record key, tuning key): the first of ``keys`` (the
        call's own tuning key, then its bucket's) with a record, else the miss policy. A
        tuning miss in strict mode is counted, not raised: the default config serves when a
        cached CUBIN covers the call (`resolve` raises when none does)."""
        tuned, ctx = self.tuned, self.ctx
        if ctx.settings.disable_autotune:
            return tuned.default_config(w), "disabled", None, keys[-1]
        record_key = None
        for tk in keys:
            memo_key = (json.dumps(tk, sort_keys=True), arch, gpu)
            known = self._winners.get(memo_key)
            record_key = None
            if ctx.toolchain_fp is not None:
                record_key = record_key_for(tuned, tk, arch, gpu, ctx.toolchain_fp)
            if known is not None:
                return known[0], known[1] if known[1] != "cache" else "memory", record_key, tk
            record = ctx.store.get_tuning(record_key) if (
                record_key is not None and ctx.store is not None) else None
            if record is not None:
                cfg = Config(record.get("config") or {}, tuned.name)
                if self._in_space(cfg):
                    if not dry:
                        self._winners[memo_key] = (cfg, "cache")
                    return cfg, "cache", record_key, tk
                log.warning("ctbuild: kernel %r: tuning record %s names config %s, which is not "
                            "in the declared search space (stale record?); treated as a miss",
                            tuned.name, record_key, record.get("config"))
        tk = keys[-1]
        memo_key = (json.dumps(tk, sort_keys=True), arch, gpu)
        if dry:
            return tuned.default_config(w), "default", record_key, tk
        message = tuning_miss_message(
            kernel=tuned.name, module=tuned.module, tuning_key=tk, arch=arch, gpu=gpu,
            key=record_key or "(none: no toolchain)", toolchain_fp=ctx.toolchain_fp,
            cache_dir=ctx.cache_dir, workload=wl_json)
        self.note_miss("tuning", record_key or json.dumps(tk), message, wl_json, arch)
        if ctx.mode == "tune":
            cfg = self._tune_online(w, tk, arch, gpu, record_key, stream)
            self._winners[memo_key] = (cfg, "online")
            return cfg, "online", record_key, tk
        cfg = tuned.default_config(w)
        self._winners[memo_key] = (cfg, "default")
        return cfg, "default", record_key, tk

    def _cover(self, cfg: Config, spec_w: Workload, arch: str) -> tuple[str | None, str | None]:
        """(compile key, class) of the most specialised cached CUBIN serving this call with
        this config, or (the exact compile key, None) when none does -- the same lattice
        `ServedKernel._compile` walks inside the launch. (None, "exact") when the signature
        cannot be derived up front: the dispatcher will judge."""
        tuned, ctx = self.tuned, self.ctx
        try:
            signature = derive_signature(tuned.kernel, tuned.kernel_args(cfg, spec_w))
        except Exception as exc:  # the dispatcher will judge; ServedKernel handles a miss
            log.debug("ctbuild: %s: cannot derive the signature up front: %s", tuned.name, exc)
            return None, "exact"
        found = ctx.source.covering(tuned, cfg, signature, arch)
        if found is not None:
            return found[1], found[0]
        return ctx.source.key_for(tuned, cfg, signature, arch), None

    def _cubin_miss(self, cfg: Config, key: str, arch: str, wl_json: dict) -> None:
        """No cached CUBIN covers the call: count and record it; strict mode raises."""
        tuned, ctx = self.tuned, self.ctx
        message = cubin_miss_message(kernel=tuned.name, module=tuned.module,
                                     config=cfg.to_json(), arch=arch, key=key,
                                     toolchain_fp=ctx.toolchain_fp, cache_dir=ctx.cache_dir,
                                     workload=wl_json)
        self.note_miss("cubin", key, message, wl_json, arch)
        if ctx.mode == "strict":
            raise CacheMissError(message, kernel=tuned.name, what="cubin", key=key, arch=arch)

    def note_miss(self, what: str, key: str, message: str, wl_json: dict | None,
                  arch: str) -> None:
        self.ctx.misses.miss(what, self.name, key, message)
        if wl_json is not None:
            self.ctx.misses.write_record(self.name, wl_json, arch)

    def _tune_online(self, w: Workload, tk: list, arch: str, gpu: str, record_key: str | None,
                     stream: Any) -> Config:
        """Tune this workload on this GPU now (``CTBUILD_MODE=tune``) and record the winner.

        The ``ctbuild tune`` engine (`ctbuild.tune.tuner.tune_workload`) measures the candidates,
        launched through this runtime's served kernels: cached CUBINs where present, JIT ones
        (written back when allowed) where not. It records the winner when the cache is writable.
        The caller's in-place arguments are restored afterwards: the real launch applies the
        kernel once."""
        from ..tune import tuner as tuning
        tuned, ctx = self.tuned, self.ctx
        device = self._device_for(w)
        snapshots = {name: w[name].clone() for name in tuned.restore}
        start = time.perf_counter()
        try:
            rec = tuning.tune_workload(
                tuned, w, store=ctx.store, toolchain_fp=ctx.toolchain_fp,
                device=tuning.Device(device, arch, gpu, tuning.driver_version()),
                timeout_s=None, write=ctx.writable and record_key is not None,
                stream=_torch_stream(stream, device), served=self.served_kernel)
        finally:
            for name, snap in snapshots.items():
                w[name].copy_(snap)
        if not rec.get("config"):
            failures = "; ".join(f"{f['config']}: {f['error']}" for f in rec["failures"][:3])
            raise KernelCallError(f"kernel {tuned.name!r}: online tuning measured no candidate "
                                  f"on {gpu} ({failures})")
        cfg = Config(rec["config"], tuned.name)
        log.warning("ctbuild: kernel %r tuned online on %s in %.2f s: %s", tuned.name, gpu,
                    time.perf_counter() - start, cfg)
        return cfg

    def _reraise(self, exc: Exception) -> None:
        named = self._named(exc)
        if named is exc:
            raise exc
        raise named from exc

    def _named(self, exc: BaseException) -> BaseException:
        """The same error with the kernel's name in front (its type kept where possible)."""
        prefix = f"kernel {self.name!r}"
        text = str(exc)
        if text.startswith(prefix) or isinstance(exc, CacheMissError):
            return exc
        message = f"{prefix} ({self.tuned.module}): {type(exc).__name__}: {text}"
        try:
            if len(exc.args) == 1 and isinstance(exc.args[0], str):
                new = type(exc)(message)
                if str(new) == message:
                    return new
        except Exception:
            pass
        return KernelCallError(message)

    # ---- what happened ----
    def provenance(self) -> dict[str, Any]:
        """Where this kernel's launches came from: counts by origin and per resolved call."""
        origins: Counter = Counter({o: 0 for o in ORIGINS})
        classes: Counter = Counter({c: 0 for c in CUBIN_CLASSES})
        rows = []
        for e in list(self._entries):
            info = e.info
            origin = "jit" if info["cubin_from"] == "jit" else ORIGIN_OF_CONFIG.get(
                info["config_from"], info["config_from"])
            origins[origin] += e.calls
            classes[info["cubin_class"]] += e.calls
            rows.append({"origin": origin, "launches": e.calls,
                         **{k: v for k, v in info.items() if k != "config_obj"}})
        return {"kernel": self.name, "mode": self.ctx.mode,
                "launches": sum(origins.values()), "origins": dict(origins),
                "classes": dict(classes),
                "misses": self.ctx.misses.total(self.name), "served_kernels": len(self._served),
                "entries": rows}
