"""Compile one planned job to a CUBIN, in whatever process runs it (a farm worker, a test).

The worker re-derives the job's compile key from its own view of the kernel source and the
toolchain it finds. A mismatch means the worker would build something other than what the
driver planned (another toolchain, env, or source version): that is an error, never a silent mix.
"""
from __future__ import annotations

import importlib
import tempfile
import time
from typing import Any

from .declare import registered
from .specs import Workload, spec_from_json
from .space import Config

#: Per-process TileContext without cuTile's own disk cache (ctbuild's cache is the cache).
_CONTEXT: Any = None


class CompileMismatchError(RuntimeError):
    """The worker's toolchain or kernel source differs from the driver's plan."""


def _context(timeout_sec: float | None) -> Any:
    global _CONTEXT
    from cuda.tile._cext import TileContext
    from cuda.tile._context import TileContextConfig
    if _CONTEXT is None:
        _CONTEXT = TileContext(config=TileContextConfig(
            temp_dir=tempfile.mkdtemp(prefix="ctbuild-"), compiler_timeout_sec=timeout_sec,
            enable_crash_dump=False, cache_dir=None, cache_size_limit=0))
    _CONTEXT.config.compiler_timeout_sec = timeout_sec
    return _CONTEXT


def find_kernel(module: str, name: str) -> Any:
    importlib.import_module(module)
    for k in registered():
        if k.name == name and k.module == module:
            return k
    raise LookupError(f"module {module} declares no kernel named {name!r}")


def compile_job(job: dict[str, Any], *, timeout_sec: float | None = None) -> dict[str, Any]:
    """Compile ``job`` (a `CompileJob` as JSON): cubin, symbol, seconds, and the entry's
    ``meta`` (kernel, arch, config...: what ``ctbuild cache ls/rm/export`` select on)."""
    from cuda.tile._compile import compile_tile
    from .plan import job_and_signature
    from .signature_classes import Weakening
    from .toolchain import probe

    kernel = find_kernel(job["module"], job["kernel"])
    cfg = Config(job["config"], kernel.name)
    w = Workload({k: spec_from_json(v) for k, v in job["workload"].items()})
    toolchain = probe()
    mine, signature = job_and_signature(kernel, cfg, w, job["arch"], toolchain.fingerprint,
                                        Weakening.from_json(job.get("weaken")))
    if mine.key != job["key"]:
        why = "toolchain" if mine.kernel_fp == job["kernel_fp"] else "kernel source"
        raise CompileMismatchError(
            f"{job['kernel']} {cfg!r}: this worker's {why} differs from the planner's "
            f"(worker toolchain {toolchain.fingerprint[:12]}, kernel {mine.kernel_fp[:12]}; "
            f"planned kernel {job['kernel_fp'][:12]}); install the same cuda-tile/tileiras and "
            "sources on every worker")
    start = time.perf_counter()
    result = compile_tile(kernel.kernel._annotated_function, (signature,), job["arch"],
                          kernel.compiler_options(cfg), _context(timeout_sec))
    seconds = time.perf_counter() - start
    if not result.cubin:
        raise RuntimeError(f"{job['kernel']} {cfg!r}: tileiras produced an empty CUBIN")
    if result.library_lifecycle_providers:
        raise RuntimeError(f"{job['kernel']}: links cuTile library modules, which ctbuild "
                           "cannot serve from its cache yet")
    meta = {f: job[f] for f in ("kernel", "module", "kernel_fp", "arch", "config", "workload")}
    meta["class"] = Weakening.from_json(job.get("weaken")).cls
    meta.update(toolchain=toolchain.fingerprint, compile_seconds=round(seconds, 4))
    return {"cubin": bytes(result.cubin), "symbol": result.kernel_signatures[0].symbol,
            "seconds": seconds, "toolchain": toolchain.fingerprint, "meta": meta}
