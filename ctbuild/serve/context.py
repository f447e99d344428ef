"""The process-wide runtime context: settings, the cache store and its toolchain, the CUBIN
source served kernels read, per-device facts, misses and JIT write-back.

One context per process, created from the environment on first use (`context`), replaced by
`configure` (tests, services that don't use env vars) or `reset`.
"""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..arch import Arch
from ..space import Config
from .miss_policy import (
    CacheMissError,
    MissLog,
    RuntimeConfigError,
    Settings,
    cubin_miss_message,
    note_damage,
    parse_mode,
)
from .served_kernel import STATS, CubinSource, ServedKernel

log = logging.getLogger("ctbuild.runtime")


@dataclass
class _Pending:
    """The slow-path call in progress on this thread (for CUBIN misses inside ct.launch)."""
    workload_json: dict[str, Any] | None
    cubin_from: str = "cache"
    cubin_miss_noted: bool = False


class RuntimeContext:
    """Settings, the cache store, its toolchain, the CUBIN source, per-device facts, misses."""

    def __init__(self, settings: Settings | None = None, store: Any = None) -> None:
        self.settings = settings or Settings.from_env()
        self.cache_dir = Path(getattr(store, "path", None) or self.settings.cache_dir
                              ).expanduser().absolute()
        self.mode = self.settings.mode
        self.misses = MissLog(record=self.settings.record)
        note_damage(self.cache_dir, None)
        self.store = store if store is not None else self._open_store()
        if self.store is not None and hasattr(self.store, "on_damage"):
            self.store.on_damage = self._on_damage
            if self.store.damage is not None:
                self._on_damage(self.store.damage)
        self.toolchain_fp = self._select_toolchain()
        self.source = CubinSource(self.store, self.toolchain_fp, on_miss=self.on_cubin_miss)
        self._devices: dict[int, tuple[str, str]] = {}
        self._local_fp: str | None | bool = False  # False: not probed yet
        self._lock = threading.Lock()
        self._tls = threading.local()
        self.writebacks = 0

    def _open_store(self) -> Any:
        from cache import Store
        try:
            return Store(self.cache_dir, on_damage=self._on_damage)
        except Exception as exc:  # a broken or foreign cache dir: every lookup is a miss
            log.error("ctbuild: cannot open the cache at %s: %s; every lookup is a miss",
                      self.cache_dir, exc)
            return None

    def _on_damage(self, detail: str) -> None:
        """A read failed on a damaged cache: lookups are misses; strict-mode errors say why."""
        note_damage(self.cache_dir, detail)

    def _select_toolchain(self) -> str | None:
        """The fingerprint of the toolchain the cache's entries were built with, for this env.

        An unclassified ``CUDA_TILE_*`` variable makes that unknowable: in default and tune mode
        it is one warning and every lookup a miss (default config, JIT), never a per-call error;
        strict mode refuses to serve with one message."""
        if self.store is None:
            return None
        from ..toolchain import ToolchainError, select_recorded
        try:
            fp = select_recorded(self.store.toolchains())
        except ToolchainError as exc:
            if self.mode == "strict":
                raise RuntimeConfigError(
                    f"ctbuild: {exc}. Strict mode serves only CUBINs built for this exact "
                    "environment, so it refuses to serve; unset the variable (or set "
                    "CTBUILD_MODE=default to run on the default configs with JIT)") from None
            log.warning("ctbuild: %s; serving no CUBIN or tuning record from the cache at %s "
                        "(every call is a miss: default config, JIT-compiled)", exc, self.cache_dir)
            return None
        if fp is None:
            log.warning("ctbuild: the cache at %s records no toolchain for this cuda-tile "
                        "version and env: no CUBIN can be served from it", self.cache_dir)
        return fp

    @property
    def writable(self) -> bool:
        return self.store is not None and not self.store.readonly

    # -- devices --
    def device_info(self, device: int) -> tuple[str, str]:
        """(arch, GPU name) of a CUDA device, cached."""
        info = self._devices.get(device)
        if info is None:
            import torch
            major, minor = torch.cuda.get_device_capability(device)
            info = (str(Arch.from_capability(major, minor)), torch.cuda.get_device_name(device))
            self._devices[device] = info
        return info

    # -- the pending call of this thread (what a CUBIN miss inside ct.launch belongs to) --
    @property
    def pending(self) -> "_Pending | None":
        return getattr(self._tls, "pending", None)

    @pending.setter
    def pending(self, value: "_Pending | None") -> None:
        self._tls.pending = value

    # -- CUBIN misses (called by ServedKernel._compile from inside ct.launch) --
    def on_cubin_miss(self, served: ServedKernel, signature: Any, context: Any, arch: str
                      ) -> tuple[bytes, str]:
        tuned, cfg = served.tuned, served.config
        key = self.source.key_for(tuned, cfg, signature, arch)
        pending = self.pending
        spec_json = pending.workload_json if pending is not None else None
        message = cubin_miss_message(
            kernel=tuned.name, module=tuned.module, config=cfg.to_json(), arch=arch, key=key,
            toolchain_fp=self.toolchain_fp, cache_dir=self.cache_dir, workload=spec_json,
            why="missing or corrupt")
        if pending is None or not pending.cubin_miss_noted:
            tuned.runtime.note_miss("cubin", key, message, spec_json, arch)
        if self.mode == "strict":
            raise CacheMissError(message, kernel=tuned.name, what="cubin", key=key, arch=arch)
        cubin, symbol = served.jit_compile(signature, context, arch)
        if pending is not None:
            pending.cubin_from = "jit"
        self.write_back(tuned, cfg, key, cubin, symbol, arch)
        return cubin, symbol

    def local_toolchain(self) -> str | None:
        if self._local_fp is False:
            from ..toolchain import ToolchainError, probe
            try:
                self._local_fp = probe().fingerprint
            except (ToolchainError, OSError) as exc:
                log.info("ctbuild: no local toolchain to write JIT results back (%s)", exc)
                self._local_fp = None
        return self._local_fp  # type: ignore[return-value]

    def write_back(self, tuned: Any, cfg: Config, key: str, cubin: bytes, symbol: str,
                   arch: str) -> bool:
        """Store a JIT-compiled CUBIN when the cache is writable and this process's toolchain
        is the one the cache's entries were built with (else it would be a foreign CUBIN)."""
        if not self.writable or self.toolchain_fp is None:
            return False
        if self.local_toolchain() != self.toolchain_fp:
            return False
        try:
            self.store.put_compile(key, cubin, symbol=symbol, meta={
                "kernel": tuned.name, "module": tuned.module, "kernel_fp": tuned.fingerprint,
                "arch": arch, "config": cfg.to_json(), "toolchain": self.toolchain_fp,
                "source": "runtime-jit"})
        except Exception as exc:
            log.warning("ctbuild: could not write a JIT CUBIN of %s back to %s: %s",
                        tuned.name, self.cache_dir, exc)
            return False
        with self._lock:
            self.writebacks += 1
        return True


_CONTEXT: RuntimeContext | None = None
_CONTEXT_LOCK = threading.Lock()


def context() -> RuntimeContext:
    """The process's runtime context (created on first use from the environment)."""
    global _CONTEXT
    ctx = _CONTEXT
    if ctx is None:
        with _CONTEXT_LOCK:
            if _CONTEXT is None:
                _CONTEXT = RuntimeContext()
            ctx = _CONTEXT
    return ctx


def configure(*, cache_dir: str | Path | None = None, mode: str | None = None,
              disable_autotune: bool | None = None, record: str | Path | None = None,
              store: Any = None) -> RuntimeContext:
    """Replace the process's runtime context (tests, services that don't use env vars).

    Unset arguments come from the environment. Kernels pick it up on their next call."""
    base = Settings.from_env()
    settings = Settings(
        cache_dir=Path(cache_dir) if cache_dir is not None else base.cache_dir,
        mode=parse_mode(mode) if mode is not None else base.mode,
        disable_autotune=base.disable_autotune if disable_autotune is None else disable_autotune,
        record=Path(record) if record is not None else base.record)
    return _install(RuntimeContext(settings, store=store))


def reset() -> None:
    """Forget the context and every kernel's runtime (the next call re-reads the env)."""
    _install(None)


def _install(ctx: RuntimeContext | None) -> Any:
    global _CONTEXT
    from ..declare import registered
    with _CONTEXT_LOCK:
        _CONTEXT = ctx
        for k in registered():
            k._runtime = None
    return ctx


def stats() -> dict[str, Any]:
    """Process-wide counters: served CUBIN hits (by signature class) and misses, JIT compiles
    (and failed attempts), misses by kind."""
    ctx = _CONTEXT
    return {"cubin_hits": STATS.hits, "cubin_misses": STATS.misses,
            "jit_compiles": STATS.jit_compiles, "jit_failures": STATS.jit_failures,
            "cubin_classes": {"exact": STATS.exact, "relaxed": STATS.relaxed,
                              "generic": STATS.generic},
            "misses": ctx.misses.total() if ctx else {},
            "writebacks": ctx.writebacks if ctx else 0}
