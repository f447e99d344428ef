"""``CTBUILD_MODE=tune``: tune a call that has no tuning record, now, on this GPU.

The serve phase's one bridge to the tune phase, imported inside the function: a service that
never tunes online never loads ``ctbuild.tune``.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from ..space import Config
from ..specs import Workload
from .errors import KernelCallError
from .served_kernel import ServedKernel
from .streams import torch_stream

if TYPE_CHECKING:
    from ctbuild.cache import Store

    from ..declare import TunedKernel
    from .context import RuntimeContext

log = logging.getLogger("ctbuild.runtime")


def tune_online(tuned: TunedKernel, ctx: RuntimeContext, w: Workload, *, device: int, arch: str,
                gpu: str, record_key: str | None, stream: Any,
                served: Callable[[Config], ServedKernel]) -> Config:
    """Tune this workload on this GPU and record the winner; return it.

    The ``ctbuild tune`` engine (`ctbuild.tune.tuner.tune_workload`) measures the candidates,
    launched through the runtime's served kernels (``served``): cached CUBINs where present,
    JIT ones (written back when allowed) where not. It records the winner when the cache is
    writable. The caller's in-place arguments are restored afterwards: the real launch applies
    the kernel once."""
    from ..tune import tuner as tuning
    snapshots = {name: w[name].clone() for name in tuned.restore}
    start = time.perf_counter()
    try:
        rec = tuning.tune_workload(
            # the serving store is a `ctbuild.cache.Store`; `KernelStore` names only what serving calls
            tuned, w, store=cast("Store | None", ctx.store), toolchain_fp=ctx.toolchain_fp,
            device=tuning.Device(device, arch, gpu, tuning.driver_version()),
            timeout_s=None, write=ctx.writable and record_key is not None,
            stream=torch_stream(stream, device), served=served)
    finally:
        for name, snap in snapshots.items():
            w[name].copy_(snap)
    if not rec.config:
        failures = "; ".join(f"{f['config']}: {f['error']}" for f in rec.failures[:3])
        raise KernelCallError(f"kernel {tuned.name!r}: online tuning measured no candidate "
                              f"on {gpu} ({failures})")
    cfg = Config(rec.config, tuned.name)
    log.warning("ctbuild: kernel %r tuned online on %s in %.2f s: %s", tuned.name, gpu,
                time.perf_counter() - start, cfg)
    return cfg
