"""Compile one planned job to a CUBIN, in whatever process runs it (a farm worker, a test).

The worker re-derives the job's compile key from its own view of the kernel source and the
toolchain it finds. A mismatch means the worker would build something other than what the
driver planned (another toolchain, env, or source version): that is an error, never a silent mix.

The compile runs cuTile's front end itself (`ctbuild.tileir`) with debug info anonymized and
hands that bytecode to tileiras: the CUBIN then holds no file path, and the bytecode's digest, recorded in
the cache entry, lets ``ctbuild cache verify --identity`` check the kernel fingerprint.
"""
from __future__ import annotations

import importlib
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from .. import cutile
from ..declare import TunedKernel, registered
from ..records import CompileMeta
from ..space import Config
from ..specs import Workload, spec_from_json
from ..tileir import TILEIR_FORMAT, TileIR
from ..tileir import derive as tileir


class CompileMismatchError(RuntimeError):
    """The worker's toolchain or kernel source differs from the driver's plan."""


def find_kernel(module: str, name: str) -> TunedKernel:
    importlib.import_module(module)
    for k in registered():
        if k.name == name and k.module == module:
            return k
    raise LookupError(f"module {module} declares no kernel named {name!r}")


def _located(exc: BaseException) -> BaseException:
    """A cuTile front-end error of the same class whose first line (what a build report
    shows) names the kernel's file:line; ``exc`` itself where that cannot be built."""
    from .body_check import location, one_line
    where = location(exc)
    if where is None:
        return exc
    try:
        return type(exc)(f"{where}: {one_line(exc)}", getattr(exc, "loc"))  # noqa: B009
    except Exception:  # noqa: BLE001 - a class with another constructor: keep the original
        return exc


class TileirasError(RuntimeError):
    """tileiras exited non-zero; the message is its own reason, on one line."""


def _tileiras_reason(exc: Any) -> str:
    """``tileiras exit N: <its stderr, one line>``: cuTile's message puts "Return code N" on a
    line of its own, which a one-line report would show alone."""
    lines = [line.strip() for line in str(getattr(exc, "message", exc)).splitlines()
             if line.strip()]
    code = lines.pop(0).removeprefix("Return code ") if lines and \
        lines[0].startswith("Return code") else "?"
    said = "; ".join(lines) or "it wrote no reason on stderr"
    return f"tileiras exit {code}: {said} (flags: {getattr(exc, 'compiler_flags', '?')})"


def _tileiras(ir: TileIR, options: Any, arch: str, timeout_sec: float | None) -> bytes:
    """Compile front-end output to a CUBIN with tileiras, in the cleaned compile env."""
    from cuda.tile import TileCompilerExecutionError

    from ..toolchain import TOOLKIT_ENV_VARS, compile_environment

    with cutile.compiler_lock(), compile_environment(), tempfile.TemporaryDirectory(
            prefix="ctbuild-") as tmp:
        source = Path(tmp) / "kernel.bytecode"
        source.write_bytes(ir.front_end.bytecode)
        try:
            cubin = cutile.compile_cubin(str(source), options, arch, ir.front_end,
                                         timeout_sec)
        except TileCompilerExecutionError as exc:
            reason = _tileiras_reason(exc)
            if (passed := [f"{v}={os.environ[v]}" for v in TOOLKIT_ENV_VARS if v in os.environ]):
                raise TileirasError(f"{reason} (tileiras ran with {', '.join(passed)}, which "
                                    "selects the ptxas/libnvvm it uses; unset it)") from None
            raise TileirasError(reason) from None
        return Path(cubin).read_bytes()


def compile_job(job: dict[str, Any], *, timeout_sec: float | None = None) -> dict[str, Any]:
    """Compile ``job`` (a `CompileJob` as JSON): cubin, symbol, seconds, and the entry's
    ``meta`` (kernel, arch, config...: what ``ctbuild cache ls/rm/export`` select on, and
    ``tileir``: the digest of the anonymized TileIR bytecode the CUBIN was built from)."""
    from ..signature_classes import Weakening
    from ..toolchain import probe
    from .plan import job_and_signature

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
    try:
        ir = tileir(kernel, cfg, signature, job["arch"])
    except Exception as exc:  # noqa: BLE001 - re-raised, its kernel line on its first line
        raise _located(exc) from None
    if ir.links_libraries:
        raise RuntimeError(f"{job['kernel']}: links cuTile library modules, which ctbuild "
                           "cannot serve from its cache yet")
    cubin = _tileiras(ir, kernel.compiler_options(cfg), job["arch"], timeout_sec)
    seconds = time.perf_counter() - start
    if not cubin:
        raise RuntimeError(f"{job['kernel']} {cfg!r}: tileiras produced an empty CUBIN")
    meta = CompileMeta(
        kernel=job["kernel"], module=job["module"], kernel_fp=job["kernel_fp"],
        arch=job["arch"], config=job["config"], workload=job["workload"],
        toolchain=toolchain.fingerprint, compile_seconds=round(seconds, 4), tileir=ir.digest,
        tileir_format=TILEIR_FORMAT,
        cls=Weakening.from_json(job.get("weaken")).cls, weaken=job.get("weaken"))
    return {"cubin": cubin, "symbol": mine.symbol, "seconds": seconds,
            "toolchain": toolchain.fingerprint, "meta": meta.to_json()}
