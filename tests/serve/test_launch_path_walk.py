"""`ctbuild.cutile.walk_launch_path` (what preload does so that a first call does not pay
cuTile's first-launch set-up) through cuTile's real dispatcher on a stub libcuda: it reaches the
compile step, loads and launches nothing, and leaves later launches to their own kernels."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import json, sys
sys.path.insert(0, {root!r})
import cuda.tile as ct
from ctbuild import cutile

class Arr:
    def __init__(self, ptr, n):
        self.__cuda_array_interface__ = {{"shape": (n,), "typestr": "<f4", "data": (ptr, False),
                                          "version": 3, "strides": None}}

compiled = []

class Recording(ct.kernel):
    def _compile(self, signature, context, compute_capability=None):
        compiled.append(signature.with_mangled_symbol(self._pyfunc.__name__).symbol)
        raise KeyError("recorded")

def body(x):
    pass

walked = cutile.walk_launch_path(0, Arr(0x10000000, 8))
print("--after-walk--", file=sys.stderr, flush=True)
try:
    ct.launch(0, (1, 1, 1), Recording(body), (Arr(0x10000000, 8),))
except KeyError:
    pass
refused = cutile.walk_launch_path(0, object())
print(json.dumps({{"walked": walked, "compiled": compiled, "refused": refused}}))
"""


def test_the_walk_reaches_compile_and_launches_nothing(stub_libcuda_dir: Path) -> None:
    env = {**os.environ, "LD_LIBRARY_PATH": str(stub_libcuda_dir), "STUB_LIBCUDA_LOG": "1"}
    proc = subprocess.run([sys.executable, "-c", SCRIPT.format(root=str(ROOT))],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["walked"] is True
    # a kernel launched after the walk still gets its own compile step (nothing was cached
    # under its signature by the walk), and a launch path that cannot be walked says so
    assert len(out["compiled"]) == 1 and out["compiled"][0]
    assert out["refused"] is False
    walk_log = proc.stderr.split("--after-walk--")[0]
    assert "cuInit" in walk_log  # the dispatcher's set-up ran during the walk
    for call in ("cuLibraryLoadData", "cuLaunchKernel", "cuModuleLoadData"):
        assert f"call {call}\n" not in walk_log and f"call {call}Ex" not in walk_log
