"""What the runtime does when the cache lacks a tuning record or a CUBIN (``CTBUILD_MODE``).

- ``strict``: raise `CacheMissError`, naming the kernel, the key, the arch and the command that
  fixes it. For production images that must never compile or tune at run time.
- ``default`` (the default): use the kernel's default config; JIT-compile a missing CUBIN and
  write it back when the cache is writable and the local toolchain is the cache's.
- ``tune``: tune online over the kernel's candidates for this arch (measured on this GPU), record
  the winner, JIT-compiling what is missing.

``CTBUILD_DISABLE_AUTOTUNE=1`` always uses the default config (tuning records are not read).
Every miss is counted and logged once per key; ``CTBUILD_RECORD=FILE`` appends each distinct
missed (kernel, workload, arch) as a JSON line for ``ctbuild precompile --from-record FILE``.

This is the only module that tests the mode. `MissPolicy` decides a tuning miss, a CUBIN miss
found while resolving a call, and a CUBIN miss inside a launch: cuTile's dispatcher calls
`ServedKernel._compile`, which calls `MissPolicy.on_launch_miss` directly.
`serve_without_toolchain` decides what a cache whose toolchain cannot be told does.
"""
from __future__ import annotations

import contextlib
import json
import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import settings
from ..space import Config
from .misses import MissLog, cubin_miss_message, tuning_miss_message
from .served_kernel import LAST_SERVED, ServedKernel
from .write_back import WriteBack

if TYPE_CHECKING:
    from ..declare import TunedKernel

log = logging.getLogger("ctbuild.runtime")

MODES = ("strict", "default", "tune")
DEFAULT_MODE = "default"


class RuntimeConfigError(ValueError):
    """A runtime setting (env var) has a value ctbuild does not understand."""


class CacheMissError(LookupError):
    """Strict mode: the cache has no tuning record or no CUBIN for this call."""

    def __init__(self, message: str, *, kernel: str, what: str, key: str, arch: str) -> None:
        super().__init__(message)
        self.kernel, self.what, self.key, self.arch = kernel, what, key, arch


def parse_mode(value: str | None) -> str:
    mode = (value or DEFAULT_MODE).strip().lower()
    if mode not in MODES:
        raise RuntimeConfigError(
            f"CTBUILD_MODE={value!r} is not one of {', '.join(MODES)} "
            "(strict: a miss is an error; default: default config + JIT; tune: tune online)")
    return mode


def tunes_online(mode: str) -> bool:
    """Whether a miss in this mode tunes online (and writes a tuning record)."""
    return mode == "tune"


@dataclass
class Settings:
    """Runtime settings, from the environment unless given."""
    cache_dir: Path
    mode: str = DEFAULT_MODE
    disable_autotune: bool = False
    record: Path | None = None
    #: why the cache is that one, in words (`settings.CacheChoice.why`)
    cache_from: str = ""
    #: call layouts a kernel keeps resolved before it starts over (``CTBUILD_MAX_LAYOUTS``)
    max_layouts: int = settings.DEFAULT_MAX_LAYOUTS

    @classmethod
    def from_env(cls, near: Path | None = None) -> Settings:
        """The environment's settings; the cache as `settings.choose_cache` finds it from
        ``near`` (the first kernel's folder) and the current directory."""
        try:
            cache = settings.choose_cache(near=near)
            layouts = settings.max_layouts()
        except settings.SettingsError as exc:
            raise RuntimeConfigError(f"ctbuild: {exc}") from None
        return cls(cache_dir=cache.path, cache_from=cache.why,
                   mode=parse_mode(settings.env(settings.MODE_ENV)),
                   disable_autotune=settings.env_flag(settings.DISABLE_AUTOTUNE_ENV),
                   record=settings.record_file(), max_layouts=layouts)


def serve_without_toolchain(mode: str, problem: Exception, cache_dir: Path) -> None:
    """An unclassified ``CUDA_TILE_*`` variable hides which toolchain the cache's entries fit:
    strict mode refuses to serve with one message; default and tune mode warn once and miss
    on every lookup (default config, JIT), never with a per-call error."""
    if mode == "strict":
        raise RuntimeConfigError(
            f"ctbuild: {problem}. Strict mode serves only CUBINs built for this exact "
            "environment, so it refuses to serve; unset the variable (or set "
            "CTBUILD_MODE=default to run on the default configs with JIT)") from None
    log.warning("ctbuild: %s; serving no CUBIN or tuning record from the cache at %s "
                "(every call is a miss: default config, JIT-compiled)", problem, cache_dir)


@dataclass
class FirstLaunch:
    """The first launch of a resolved call, in progress on this thread: a CUBIN miss inside
    ``ct.launch`` belongs to it. ``cubin_from``/``cubin_class`` start as resolution expected
    and end as what the dispatcher really loaded."""
    workload_json: dict[str, Any] | None
    cubin_from: str          # cache | jit
    cubin_class: str         # exact | relaxed | generic | miss
    noted: bool              # its CUBIN miss was counted while resolving


class MissPolicy:
    """What a miss does under one context's mode; counts and records every miss."""

    def __init__(self, mode: str, misses: MissLog, cache_dir: Path, toolchain_fp: str | None,
                 write_back: WriteBack) -> None:
        self.mode, self.misses, self.cache_dir = mode, misses, cache_dir
        self.toolchain_fp, self.write_back = toolchain_fp, write_back
        self._tls = threading.local()

    def tuning_miss(self, tuned: TunedKernel, *, tuning_key: list, arch: str, gpu: str,
                    record_key: str | None, workload_json: dict[str, Any], default: Config,
                    tune: Callable[[], Config]) -> tuple[Config, str]:
        """No tuning record for a call: (config, where it came from). Tune mode tunes online
        (``tune``); strict and default mode serve the default config (strict mode counts the
        miss but does not raise: a cached CUBIN of the default config may cover the call, and
        the CUBIN miss raises when none does)."""
        message = tuning_miss_message(
            kernel=tuned.name, module=tuned.module, tuning_key=tuning_key, arch=arch, gpu=gpu,
            key=record_key or "(none: no toolchain)", toolchain_fp=self.toolchain_fp,
            cache_dir=self.cache_dir, workload=workload_json)
        self.misses.note("tuning", tuned.name, record_key or json.dumps(tuning_key), message,
                         workload_json, arch)
        if self.mode == "tune":
            return tune(), "online"
        return default, "default"

    def cubin_miss(self, tuned: TunedKernel, cfg: Config, key: str, arch: str,
                   workload_json: dict[str, Any]) -> None:
        """No cached CUBIN covers a call being resolved: count and record it; strict mode
        raises (the others JIT-compile it in the launch, through `on_launch_miss`)."""
        message = cubin_miss_message(kernel=tuned.name, module=tuned.module,
                                     config=cfg.to_json(), arch=arch, key=key,
                                     toolchain_fp=self.toolchain_fp, cache_dir=self.cache_dir,
                                     workload=workload_json)
        self.misses.note("cubin", tuned.name, key, message, workload_json, arch)
        if self.mode == "strict":
            raise CacheMissError(message, kernel=tuned.name, what="cubin", key=key, arch=arch)

    def range_miss(self, tuned: TunedKernel, beyond: str, arch: str,
                   workload_json: dict[str, Any]) -> None:
        """A call with a size outside a declared `Dim`'s range: no build planned, compiled or
        tuned it, whatever CUBIN happens to cover it. Counted and recorded as a miss; strict
        mode raises."""
        message = (f"ctbuild: kernel {tuned.name!r} ({tuned.module}) on {arch}: {beyond}, so "
                   f"no build planned or tuned this call.\n  workload: "
                   f"{json.dumps(workload_json)}\n  Fix: widen the Dim in workloads=[...], then "
                   f"`ctbuild precompile --config ctbuild.toml --arch {arch}` and `ctbuild tune` "
                   "(or set CTBUILD_MODE=default to run the default config).")
        self.misses.note("range", tuned.name, json.dumps(workload_json, sort_keys=True),
                         message, workload_json, arch)
        if self.mode == "strict":
            raise CacheMissError(message, kernel=tuned.name, what="range", key="", arch=arch)

    @contextlib.contextmanager
    def first_launch(self, kernel: str, workload_json: dict[str, Any], arch: str,
                     cubin_from: str, cubin_class: str) -> Iterator[FirstLaunch]:
        """Around the first launch of a resolved call: afterwards the `FirstLaunch` says what
        really served it; a CUBIN of a weaker class than exact is recorded, so the next build
        can add the exact one."""
        launch = FirstLaunch(workload_json, cubin_from, cubin_class, noted=cubin_from == "jit")
        self._tls.launch = launch
        LAST_SERVED.cls = None
        try:
            yield launch
        finally:
            self._tls.launch = None
        served = getattr(LAST_SERVED, "cls", None) or cubin_class
        if launch.cubin_from == "jit" or served == "jit":
            served = "miss"
        launch.cubin_class = served
        if served in ("relaxed", "generic"):
            self.misses.write_record(kernel, workload_json, arch)

    def on_launch_miss(self, served: ServedKernel, signature: Any, context: Any, arch: str
                       ) -> tuple[bytes, str]:
        """No cached CUBIN for a launch (the dispatcher asked `ServedKernel._compile`): count it
        unless resolving did; strict mode raises; else JIT-compile, write back, serve."""
        tuned, cfg = served.tuned, served.config
        key = served.source.key_for(tuned, cfg, signature, arch)
        launch: FirstLaunch | None = getattr(self._tls, "launch", None)
        spec_json = launch.workload_json if launch is not None else None
        message = cubin_miss_message(
            kernel=tuned.name, module=tuned.module, config=cfg.to_json(), arch=arch, key=key,
            toolchain_fp=self.toolchain_fp, cache_dir=self.cache_dir, workload=spec_json,
            why="missing or corrupt")
        if launch is None or not launch.noted:
            self.misses.note("cubin", tuned.name, key, message, spec_json, arch)
        if self.mode == "strict":
            raise CacheMissError(message, kernel=tuned.name, what="cubin", key=key, arch=arch)
        cubin, symbol = served.jit_compile(signature, context, arch)
        if launch is not None:
            launch.cubin_from = "jit"
        self.write_back.put(tuned, cfg, key, cubin, symbol, arch, signature, spec_json)
        return cubin, symbol
