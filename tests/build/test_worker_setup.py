"""Compile workers keep torch out of their start-up (cuTile's compiler would import it: seconds
per worker) and still build byte-identical CUBINs. Real tileiras, fresh interpreters."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import at_once

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"

SCRIPT = """
import json, sys
sys.path[:0] = [{root!r}, {examples!r}]
if sys.argv[1] == "with-torch":
    import torch  # noqa: F401 - a kernel module that imports torch does this
from ctbuild.compile.worker_setup import warm_worker
info = warm_worker(["demo_kernels.elementwise"], [{examples!r}])
from ctbuild import registered
from ctbuild.arch import Arch
from ctbuild.compile.compiler import compile_job
from ctbuild.compile.plan import make_plan
import xxhash
kernels = [k for k in registered() if k.name == "silu_mul"]
plan = make_plan(kernels, [Arch("sm_90")], info["toolchain"])
job = min(plan.jobs.values(), key=lambda j: j.key)
out = compile_job(job.to_json())
print(json.dumps({{"torch": "torch" in sys.modules, "key": job.key,
                  "cubin": xxhash.xxh3_128_hexdigest(out["cubin"]),
                  "tileir": out["meta"]["tileir"], "toolchain": info["toolchain"]}}))
"""


def _build(mode: str, tmp_path: Path) -> dict:
    script = SCRIPT.format(root=str(ROOT), examples=str(EXAMPLES))
    proc = subprocess.run([sys.executable, "-c", script, mode], capture_output=True, text=True,
                          cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_worker_without_torch_builds_the_same_bytes(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    hidden, loaded = at_once(lambda: _build("plain", tmp_path),
                             lambda: _build("with-torch", tmp_path))
    assert hidden["torch"] is False  # the worker's start-up never imported torch
    assert loaded["torch"] is True
    assert hidden["toolchain"] == loaded["toolchain"] and hidden["key"] == loaded["key"]
    assert hidden["cubin"] == loaded["cubin"] and hidden["tileir"] == loaded["tileir"]


def test_torch_imports_normally_after_the_compiler_loaded_without_it() -> None:
    """... but cuTile's front end then cannot read torch dtypes: a body naming one, imported
    too late, is a TorchBlindError (a ctbuild bug), never a refusal of the body."""
    fixture = ROOT / "tests" / "fixtures" / "torch_dtype_project"
    script = (f"import sys; sys.path[:0] = [{str(ROOT)!r}, {str(fixture)!r}]\n"
              "from ctbuild.cutile import load_compiler_without_torch, torch_blind\n"
              "assert load_compiler_without_torch()\n"
              "assert 'torch' not in sys.modules and not torch_blind()\n"
              "import torch\n"
              "assert torch.zeros(2).sum().item() == 0\n"
              "assert not load_compiler_without_torch()  # loaded already: nothing to do\n"
              "from torch_dtype_kernels import silu_and_mul\n"
              "from ctbuild.arch import Arch\n"
              "from ctbuild.compile.body_check import body_problem\n"
              "from ctbuild.compile.plan import make_plan\n"
              "job = next(iter(make_plan([silu_and_mul], [Arch('sm_90')], 'x').jobs.values()))\n"
              "problem = body_problem(silu_and_mul, job)\n"
              "assert torch_blind() and problem.text.startswith('TorchBlindError: '), problem\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
