"""What a farm worker runs once before compiling: the ctbuild side of the farm's setup hook.

`ctbuild.farm` imports nothing else of ctbuild; the driver passes these top-level functions to it by
reference and Ray imports them on the workers (shipped with the ``ctbuild`` package).
"""
from __future__ import annotations

import importlib
import sys
from typing import Any

#: Removed from the driver's and every worker's environment: tileiras uses only
#: ``$CUDA_HOME``'s ptxas/libnvvm when it is set (an older toolkit there fails with exit 5), so
#: the pip tileiras with its own ptxas/libnvvm must run whatever a node's environment says.
STRIPPED_ENV = ("CUDA_HOME", "CUDA_PATH")


def warm_worker(modules: list[str], paths: list[str],
                shared_probe: dict[str, Any] | None = None) -> dict[str, Any]:
    """Import the project's kernel modules and probe the toolchain (once per worker process),
    keeping torch out of a worker whose kernel modules do not import it.

    ``shared_probe`` is the driver's probe (`toolchain.shareable`): a worker on the driver's
    machine that would probe the very same files takes it instead of probing again
    (`toolchain.adopt`); any other worker probes. Returns the worker's toolchain fingerprint,
    which the farm compares with the driver's: a worker that would build with another
    cuda-tile/tileiras is refused before it compiles.
    """
    for path in reversed(paths):
        if path not in sys.path:
            sys.path.insert(0, path)
    for name in modules:
        importlib.import_module(name)
    from ..cutile import load_compiler_without_torch
    from ..toolchain import adopt, probe
    load_compiler_without_torch()  # seconds of start-up: see there
    adopted = adopt(shared_probe)
    toolchain = probe()
    return {"toolchain": toolchain.fingerprint, "cuda_tile": toolchain.profile["cuda_tile"],
            "tileiras": toolchain.paths["tileiras"], "probe": "adopted" if adopted else "ran",
            "sources": {name: getattr(sys.modules[name], "__file__", None)
                        for name in ["ctbuild", *modules]}}
