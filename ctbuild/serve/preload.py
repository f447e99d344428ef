"""Reading a GPU's tuned CUBINs before the first call: ``ctbuild.runtime.preload()``.

A first call pays for the cache's opening, the CUDA context, its
tuning record and CUBIN (read from disk and re-hashed) and resolving it. `preload` does all of
that ahead, on a thread by default: it reads every tuning record of this GPU (its arch and
name, the cache's toolchain; only the named kernels' where ``kernels`` is given), holds each
record and its winner's verified CUBIN in memory (`cache_reader.CacheReader`), and resolves each
record's workload of the kernels already declared, which leaves their winners, served kernels
and CUBIN covers remembered. A preloaded kernel's first call then reads nothing from disk; what
stays in it is its own resolution from memory and, in cuTile's launch, the driver's module load
(``cuModuleLoadData``, about 0.1 ms per CUBIN): cuTile loads modules in its dispatcher. It also
walks cuTile's launch path once without launching (`ctbuild.cutile.walk_launch_path`): the
dispatcher's own first-launch set-up and the symbol mangler's first use, about 3 ms that the
first served call would otherwise pay.

Bounded: at most `MAX_RECORDS` records and `MAX_BYTES` of CUBINs are held (a held CUBIN is
dropped once served). With 10,000 records for one GPU, reading and checking them takes a few
hundred milliseconds on the thread; the first 4,096 (ordered by kernel name) are held and the
rest are reported as ``left`` and read from disk at their first call, as without preload.
``CTBUILD_PRELOAD=1`` starts it when ``ctbuild`` is imported.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from typing import Any

log = logging.getLogger("ctbuild.runtime")

PRELOAD_ENV = "CTBUILD_PRELOAD"
#: Most tuning records one preload holds.
MAX_RECORDS = 4096
#: Most CUBIN bytes one preload holds.
MAX_BYTES = 512 << 20


class Preload:
    """A preload in progress or done: `wait` returns its report (a dict: ``records``,
    ``cubins``, ``bytes``, ``resolved``, ``left``, ``missing``, ``seconds``, ``gpu``,
    ``arch``, ``launch_path`` (whether cuTile's launch path was readied), and ``error`` where
    it could not run)."""

    def __init__(self) -> None:
        self.report: dict[str, Any] = {}
        self.done = threading.Event()

    def wait(self, timeout: float | None = None) -> dict[str, Any]:
        self.done.wait(timeout)
        return self.report


def preload(kernels: Iterable[Any] | None = None, *, background: bool = True) -> Preload:
    """Read every tuned CUBIN of this GPU (or of the named kernels: names or declared
    kernels) into memory before the first call; see the module doc."""
    names = None if kernels is None else {getattr(k, "name", k) for k in kernels}
    job = Preload()
    if background:
        threading.Thread(target=_run, args=(job, names), name="ctbuild-preload",
                         daemon=True).start()
    else:
        _run(job, names)
    return job


def _run(job: Preload, names: set[str] | None) -> None:
    t0 = time.perf_counter()
    try:
        job.report = _load(names)
    except Exception as exc:  # noqa: BLE001 - a preload never breaks the service
        log.warning("ctbuild: preload failed: %s", exc)
        job.report = {"error": str(exc)}
    job.report["seconds"] = round(time.perf_counter() - t0, 4)
    log.info("ctbuild: preload: %s", job.report)
    job.done.set()


def _load(names: set[str] | None) -> dict[str, Any]:
    import torch

    from . import kernel_runtime  # noqa: F401 - the serving modules, imported here
    from .cache_reader import CacheReader
    from .context import context
    ctx = context()
    arch, gpu = ctx.device_info(torch.cuda.current_device())
    report: dict[str, Any] = {"arch": arch, "gpu": gpu, "records": 0, "cubins": 0, "bytes": 0,
                              "resolved": 0, "left": 0, "missing": 0,
                              "launch_path": _walk_launch_path()}
    reader = ctx.store
    if not isinstance(reader, CacheReader) or ctx.toolchain_fp is None:
        report["error"] = "no cache to read ahead from (missing, written through a store " \
                          "passed to configure, or without this toolchain)"
        return report
    chosen = sorted((r["kernel"], key, r) for key, r in reader.tuning_records()
                    if r.get("arch") == arch and r.get("gpu", gpu) == gpu
                    and r.get("toolchain", ctx.toolchain_fp) == ctx.toolchain_fp
                    and (names is None or r["kernel"] in names))
    for kernel, key, record in chosen:
        if report["records"] >= MAX_RECORDS or report["bytes"] >= MAX_BYTES:
            report["left"] += 1
            continue
        reader.held_tuning[key] = record
        report["records"] += 1
        hit = reader.get_compile(record["compile_key"])
        if hit is None:
            report["missing"] += 1
            continue
        reader.held_cubins[record["compile_key"]] = hit
        report["cubins"] += 1
        report["bytes"] += len(hit.cubin)
        report["resolved"] += _resolve(kernel, record, arch, gpu)
    return report


def _walk_launch_path() -> bool:
    """Ready cuTile's launch path on this thread's current device and stream, launching
    nothing (`ctbuild.cutile.walk_launch_path`); False where it could not (no GPU)."""
    try:
        import torch

        from .. import cutile
        from .streams import current_stream_object
        device = torch.cuda.current_device()
        return cutile.walk_launch_path(current_stream_object(device),
                                       torch.empty(1, device=f"cuda:{device}"))
    except Exception as exc:  # noqa: BLE001 - the first call readies it then
        log.debug("ctbuild: preload: cuTile's launch path not readied: %s", exc)
        return False


def _resolve(kernel: str, record: dict[str, Any], arch: str, gpu: str) -> int:
    """Resolve a record's workload where its kernel is declared (1), else nothing (0)."""
    from ..declare import registered
    from ..specs import Workload, spec_from_json
    tuned = next((k for k in registered() if k.name == kernel), None)
    if tuned is None or not isinstance(record.get("workload"), dict):
        return 0
    try:
        w = Workload({n: spec_from_json(v) for n, v in record["workload"].items()})
        tuned.runtime.resolve(tuple(w.args[p] for p in tuned.params), arch=arch, gpu=gpu)
    except Exception as exc:  # noqa: BLE001 - its first call resolves it then
        log.debug("ctbuild: preload: cannot resolve %s ahead: %s", kernel, exc)
        return 0
    return 1


#: The preload ``CTBUILD_PRELOAD=1`` started at import (``FROM_ENV.wait()`` waits for it).
FROM_ENV: Preload | None = None


def start_from_env() -> Preload | None:
    """``CTBUILD_PRELOAD=1``: start a background preload (at ``import ctbuild``)."""
    global FROM_ENV
    from ..settings import env_flag
    if env_flag(PRELOAD_ENV) and FROM_ENV is None:
        FROM_ENV = preload()
    return FROM_ENV
