"""The process-wide runtime context: settings, the cache store and its toolchain, the miss
policy, the CUBIN source served kernels read, per-device facts, misses and JIT write-back.

One context per process, created from the environment on first use (`context`), replaced by
`configure` (tests, services that don't use env vars) or `reset`.
"""
from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

from ..arch import Arch
from ..settings import CACHE_DIR_ENV, verify_mode
from .cache_reader import CacheReader
from .ir_verify import IrVerifier
from .kernel_store import KernelStore
from .ledger import LEDGER
from .miss_policy import (
    MissPolicy,
    RuntimeConfigError,
    Settings,
    parse_mode,
    serve_without_toolchain,
    tunes_online,
)
from .misses import MissLog, note_damage
from .served_kernel import STATS, CubinSource, keep_alive
from .write_back import WriteBack

log = logging.getLogger("ctbuild.runtime")


class RuntimeContext:
    """Settings, the cache store, its toolchain, the miss policy, the CUBIN source, per-device
    facts, misses."""

    def __init__(self, settings: Settings | None = None,
                 store: KernelStore | None = None, near: Path | None = None) -> None:
        self.settings = settings or Settings.from_env(near)
        self.cache_dir = Path(store.path if store is not None else self.settings.cache_dir
                              ).expanduser().absolute()
        #: why this cache, in words: `cache` says "DIR (why)" (`explain` reports it)
        self.cache_from = "runtime.configure(store=...)" if store is not None else \
            self.settings.cache_from
        self.mode = self.settings.mode
        self.misses = MissLog(record=self.settings.record)
        note_damage(self.cache_dir, None)
        with LEDGER.first("cache_open"):
            self.store = store if store is not None else self._open_store()
            if self.store is not None:
                self.store.on_damage = self._on_damage
                if self.store.damage is not None:
                    self._on_damage(self.store.damage)
            self.toolchain_fp = self._select_toolchain()
        try:
            verify = verify_mode()
        except ValueError as exc:
            raise RuntimeConfigError(str(exc)) from None
        # marked kernels always, every kernel with CTBUILD_VERIFY=ir (see ir_verify)
        self.verifier = IrVerifier(self.store, self.toolchain_fp, every=verify == "ir")
        self.write_back = WriteBack(self.store, self.toolchain_fp, self.cache_dir,
                                    self.verifier)
        self.policy = MissPolicy(self.mode, self.misses, self.cache_dir, self.toolchain_fp,
                                 self.write_back)
        self.source = CubinSource(self.store, self.toolchain_fp,
                                  on_miss=self.policy.on_launch_miss, verify=self.verifier)
        self._devices: dict[int, tuple[str, str]] = {}

    @property
    def cache(self) -> str:
        """The cache directory and why it is that one."""
        return f"{self.cache_dir} ({self.cache_from})"

    @property
    def cache_problem(self) -> tuple[str, str] | None:
        """Why this context's cache can serve nothing, and what to do (None: it can serve)."""
        if self.toolchain_fp is not None:
            return None
        if self.store is None:
            return (f"no usable cache at {self.cache}", f"point {CACHE_DIR_ENV} (or cache_dir "
                    "in ctbuild.toml) at the cache `ctbuild precompile` built")
        from ..toolchain import ToolchainError, recorded_mismatch
        try:
            why, fix = recorded_mismatch(self.store.toolchains())
        except ToolchainError as exc:
            return f"the cache {self.cache} cannot be matched to this env: {exc}", str(exc)
        return f"the cache {self.cache} {why}: it can serve nothing here", fix

    def _open_store(self) -> KernelStore | None:
        """The cache: read directly (`cache_reader`) unless this mode tunes online (it writes
        records) or the directory is not a readable cache yet, then a `ctbuild.cache.Store`; None (every
        lookup a miss) where there is no directory: resolving and explaining create none, and an
        empty new cache could serve nothing anyway."""
        if not self.cache_dir.is_dir():
            log.warning("ctbuild: no cache at %s: every lookup is a miss (set %s or cache_dir "
                        "in ctbuild.toml to the built cache)", self.cache, CACHE_DIR_ENV)
            return None
        if not tunes_online(self.mode):
            reader = CacheReader.open(self.cache_dir)
            if reader is not None:
                return reader
        from ctbuild.cache import Store
        from ctbuild.cache.layout import LAYOUT_FILE
        # A directory that holds no cache yet (an empty volume) is opened read-only: it can
        # serve nothing, and explaining or resolving must not write into it.
        fresh = not any((self.cache_dir / name).exists() for name in (LAYOUT_FILE, "compile"))
        try:
            return Store(self.cache_dir, on_damage=self._on_damage, readonly=True if fresh else None)
        except Exception as exc:  # a broken or foreign cache dir: every lookup is a miss
            log.error("ctbuild: cannot open the cache at %s: %s; every lookup is a miss",
                      self.cache_dir, exc)
            return None

    def _on_damage(self, detail: str) -> None:
        """A read failed on a damaged cache: lookups are misses; strict-mode errors say why."""
        note_damage(self.cache_dir, detail)

    def _select_toolchain(self) -> str | None:
        """The fingerprint of the toolchain the cache's entries were built with, for this env
        (None when it cannot be told: `serve_without_toolchain` decides what that means)."""
        if self.store is None:
            return None
        from ..toolchain import ToolchainError, select_recorded
        try:
            fp = select_recorded(self.store.toolchains())
        except ToolchainError as exc:
            serve_without_toolchain(self.mode, exc, self.cache_dir)
            return None
        if fp is None:
            from ..toolchain import recorded_mismatch
            why, fix = recorded_mismatch(self.store.toolchains())
            log.warning("ctbuild: the cache at %s %s: no CUBIN can be served from it; %s",
                        self.cache_dir, why, fix)
        return fp

    @property
    def writable(self) -> bool:
        return self.write_back.writable

    @property
    def writebacks(self) -> int:
        """JIT-compiled CUBINs written back to the cache by this context."""
        return self.write_back.count

    # -- devices --
    def device_info(self, device: int) -> tuple[str, str]:
        """(arch, GPU name) of a CUDA device, cached."""
        info = self._devices.get(device)
        if info is None:
            import torch
            with LEDGER.first("cuda_context"):
                major, minor = torch.cuda.get_device_capability(device)
            info = (str(Arch.from_capability(major, minor)), torch.cuda.get_device_name(device))
            self._devices[device] = info
        return info


_CONTEXT: RuntimeContext | None = None
_CONTEXT_LOCK = threading.Lock()


def context(near: Path | None = None) -> RuntimeContext:
    """The process's runtime context (created on first use from the environment; its cache's
    config is looked for upward from ``near``, the first kernel's folder, then the current
    directory: `ctbuild.settings`)."""
    global _CONTEXT
    ctx = _CONTEXT
    if ctx is None:
        with _CONTEXT_LOCK:
            if _CONTEXT is None:
                _CONTEXT = RuntimeContext(near=near)
            ctx = _CONTEXT
    return ctx


def configure(*, cache_dir: str | Path | None = None, mode: str | None = None,
              disable_autotune: bool | None = None, record: str | Path | None = None,
              store: KernelStore | None = None) -> RuntimeContext:
    """Replace the process's runtime context (tests, services that don't use env vars).

    Unset arguments come from the environment. Kernels pick it up on their next call."""
    base = Settings.from_env()
    settings = Settings(
        cache_dir=Path(cache_dir) if cache_dir is not None else base.cache_dir,
        cache_from="runtime.configure(cache_dir=...)" if cache_dir is not None else
        base.cache_from,
        mode=parse_mode(mode) if mode is not None else base.mode,
        disable_autotune=base.disable_autotune if disable_autotune is None else disable_autotune,
        record=Path(record) if record is not None else base.record,
        max_layouts=base.max_layouts)
    ctx = RuntimeContext(settings, store=store)
    _install(ctx)
    return ctx


def reset() -> None:
    """Forget the context and every kernel's runtime (the next call re-reads the env)."""
    _install(None)


def _install(ctx: RuntimeContext | None) -> None:
    """Make ``ctx`` the process's context; every declared kernel makes a new runtime for it."""
    global _CONTEXT
    from ..declare import registered
    with _CONTEXT_LOCK:
        _CONTEXT = ctx
        for k in registered():
            dropped = k.drop_runtime()
            if dropped is not None:  # a CUDA graph may still launch its kernels
                keep_alive(dropped.resolver.kernel_objects())


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
