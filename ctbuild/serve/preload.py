"""Reading a GPU's tuned CUBINs before the first call: ``ctbuild.runtime.preload()``.

A first call pays for the cache's opening, the CUDA context, its tuning record and CUBIN (read
from disk and re-hashed), resolving it, and the driver's load of its module. `preload` does all
of that ahead, on a thread by default: it reads every tuning record of this GPU (its arch and
name, the cache's toolchain; only the named kernels' where ``kernels`` is given), holds each
record and its winner's verified CUBIN in memory (`cache_reader.CacheReader`), and for each
record whose kernel is declared makes the hot-path entry its workload's calls will take
(`KernelRuntime.prepare`, on stand-ins of its tensors: `standins`), which has cuTile load the
module it launches (`ctbuild.cutile.load_module`, nothing runs). A preloaded kernel's first
call of a preloaded layout then takes the hot path: no resolving, no disk, no module load.
Another layout of it (a `Dim` size between bucket representatives, another scalar value)
resolves from memory. It also walks cuTile's launch path once without launching
(`ctbuild.cutile.walk_launch_path`), for kernels it cannot prepare.

Bounded: at most `MAX_RECORDS` records and `MAX_BYTES` of CUBINs are held (a held CUBIN is
dropped once served). With 10,000 records for one GPU, reading and checking them takes a few
hundred milliseconds on the thread; the first 4,096 (ordered by kernel name) are held, their
modules loaded (each its CUBIN's code in GPU memory, tens of KB), and the rest are reported as
``left`` and read from disk at their first call, as without preload.
``CTBUILD_PRELOAD=1`` starts it when ``ctbuild`` is imported.
"""
from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from .ledger import LEDGER
from .standins import StandIns

if TYPE_CHECKING:
    from ..declare import TunedKernel
    from .entry import Entry

log = logging.getLogger("ctbuild.runtime")

PRELOAD_ENV = "CTBUILD_PRELOAD"
#: Most tuning records one preload holds.
MAX_RECORDS = 4096
#: Most CUBIN bytes one preload holds.
MAX_BYTES = 512 << 20
#: How long the preload ``CTBUILD_PRELOAD=1`` starts at import waits for the kernels of its
#: records to be declared, their modules imported, before it leaves the rest to their first
#: calls (it checks every `POLL_S`).
WAIT_FOR_KERNELS_S = 30.0
POLL_S = 0.02


class Preload:
    """A preload in progress or done: `wait` returns its report (a dict: ``records``,
    ``cubins``, ``bytes``, ``resolved`` (hot-path entries made), ``modules`` (modules cuTile
    loaded for them), ``left``, ``missing``, ``seconds``, ``gpu``, ``arch``, ``launch_path``
    (whether cuTile's launch path was readied), and ``error`` where it could not run)."""

    def __init__(self) -> None:
        self.report: dict[str, Any] = {}
        self.done = threading.Event()

    def wait(self, timeout: float | None = None) -> dict[str, Any]:
        self.done.wait(timeout)
        return self.report


def preload(kernels: Iterable[Any] | None = None, *, background: bool = True,
            wait_for_kernels: float = 0.0) -> Preload:
    """Read every tuned CUBIN of this GPU (or of the named kernels: names or declared
    kernels) into memory and make their calls' hot-path entries before the first call; see
    the module doc. ``wait_for_kernels``: seconds to wait for kernels not yet declared (or
    whose module is still being imported) before leaving them to their first calls."""
    names = None if kernels is None else {getattr(k, "name", k) for k in kernels}
    job = Preload()
    if background:
        threading.Thread(target=_run, args=(job, names, wait_for_kernels),
                         name="ctbuild-preload", daemon=True).start()
    else:
        _run(job, names, wait_for_kernels)
    return job


def _run(job: Preload, names: set[str] | None, wait_s: float) -> None:
    t0 = time.perf_counter()
    try:
        job.report = _load(names, wait_s)
    except Exception as exc:  # noqa: BLE001 - a preload never breaks the service
        log.warning("ctbuild: preload failed: %s", exc)
        job.report = {"error": str(exc)}
    seconds = time.perf_counter() - t0
    job.report["seconds"] = round(seconds, 4)
    LEDGER.once("preload", seconds)
    LEDGER.write_env()
    log.info("ctbuild: preload: %s", job.report)
    job.done.set()


def _load(names: set[str] | None, wait_s: float) -> dict[str, Any]:
    import torch

    from . import kernel_runtime  # noqa: F401 - the serving modules, imported here
    from .cache_reader import CacheReader
    from .context import context
    if not torch.cuda.is_available():  # torch's own error says "not compiled with CUDA"
        raise RuntimeError("no CUDA GPU visible to torch: nothing to load CUBINs onto")
    ctx = context()
    arch, gpu = ctx.device_info(torch.cuda.current_device())
    report: dict[str, Any] = {"arch": arch, "gpu": gpu, "records": 0, "cubins": 0, "bytes": 0,
                              "resolved": 0, "modules": 0, "undeclared": 0, "left": 0,
                              "missing": 0,
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
    held: list[tuple[str, str, dict[str, Any]]] = []
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
        held.append((kernel, key, record))
    waited_for = _prepare_all(held, _standins(torch.cuda.current_device()), report, wait_s)
    if wait_s > 0:  # a kernel not declared in all that time is not this program's: let go
        for _, key, record in waited_for:
            reader.held_tuning.pop(key, None)
            reader.held_cubins.pop(record["compile_key"], None)
    return report


def _prepare_all(held: list[tuple[str, str, dict[str, Any]]], standins: StandIns | None,
                 report: dict[str, Any], wait_s: float) -> list[tuple[str, str, dict[str, Any]]]:
    """Prepare each held record whose kernel is declared and its module imported; wait up to
    ``wait_s`` for the others. Returns those still waiting (``undeclared``)."""
    from ..declare import registered
    waiting: dict[str, list[tuple[str, str, dict[str, Any]]]] = {}
    for item in held:
        waiting.setdefault(item[0], []).append(item)
    deadline = time.monotonic() + wait_s
    while True:
        declared = {k.name: k for k in registered()}
        for name in list(waiting):
            tuned = _ready(declared.get(name), main_done=wait_s == 0)
            if tuned is None:
                continue
            for _, _, record in waiting.pop(name):
                entry = _prepare(tuned, record, standins)
                if entry is not None:
                    report["resolved"] += 1
                    report["modules"] += not entry.empty
        if not waiting or time.monotonic() >= deadline:
            break
        time.sleep(POLL_S)
    left = [item for items in waiting.values() for item in items]
    report["undeclared"] = len(left)
    return left


def _ready(tuned: TunedKernel | None, main_done: bool) -> TunedKernel | None:
    """``tuned`` once its module has been imported, else None.

    A kernel is declared while its module is still running; what its fingerprint reads (the
    module's constants and helpers below it) may not exist yet, and a fingerprint taken then
    would be wrong for the process. So a kernel of a module still being imported waits; so
    does one of the main script (it runs until the process ends) unless ``main_done``: a
    preload that waits for nothing was called by the program, after what it declared."""
    if tuned is None or (tuned.module == "__main__" and not main_done):
        return None
    module = sys.modules.get(tuned.module)
    if module is None or getattr(getattr(module, "__spec__", None), "_initializing", False):
        return None
    return tuned


def _standins(device: int) -> StandIns | None:
    try:
        return StandIns(device)
    except Exception as exc:  # noqa: BLE001 - the first calls resolve and load then
        log.debug("ctbuild: preload: no stand-in tensors on cuda:%d: %s", device, exc)
        return None


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


def _prepare(tuned: TunedKernel, record: dict[str, Any], standins: StandIns | None
             ) -> Entry | None:
    """The hot-path entry of a record's workload, its module loaded (`KernelRuntime.prepare`,
    on stand-ins of the workload's tensors); None where it cannot be made ahead."""
    from ..specs import Workload, spec_from_json
    if standins is None or not isinstance(record.get("workload"), dict):
        return None
    try:
        w = Workload({n: spec_from_json(v) for n, v in record["workload"].items()})
        return tuned.runtime.prepare(standins.args(tuple(w.args[p] for p in tuned.params)))
    except Exception as exc:  # noqa: BLE001 - its first call resolves it then
        log.debug("ctbuild: preload: cannot prepare %s ahead: %s", tuned.name, exc)
        return None


#: The preload ``CTBUILD_PRELOAD=1`` started at import (``FROM_ENV.wait()`` waits for it).
FROM_ENV: Preload | None = None


def preloading() -> Preload | None:
    """The preload ``CTBUILD_PRELOAD=1`` started at import (``.wait()`` returns its report),
    or None."""
    return FROM_ENV


def start_from_env() -> Preload | None:
    """``CTBUILD_PRELOAD=1``: start a background preload (at ``import ctbuild``)."""
    global FROM_ENV
    from ..settings import env_flag
    if env_flag(PRELOAD_ENV) and FROM_ENV is None:
        FROM_ENV = preload(wait_for_kernels=WAIT_FOR_KERNELS_S)
    return FROM_ENV
