"""A project whose own ``cache.py`` and ``farm.py`` sit beside its kernel module, which imports
them: ``ctbuild plan``, ``ctbuild precompile`` (local workers) and serving import the project's
modules under those names, and ctbuild its own ``ctbuild.cache`` and ``ctbuild.farm``.

Both ways a shared name breaks were seen: ctbuild's package loaded first and the project got it
(plan run from elsewhere: ``module 'cache' has no attribute 'TILES'``), or the project's module
was found first and ctbuild got it (run inside the project: ``'farm' is not a package``)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

#: The project: its tile sizes come from its cache.py, its workload and a device function the
#: kernel calls from its farm.py.
FILES = {
    "ctbuild.toml": 'modules = ["user_kernels"]\npaths = ["."]\narchs = ["sm_90"]\n'
                    "generic_fallback = false\n",
    "cache.py": '"""The project\'s own module named cache."""\nTILES = [32, 128]\n',
    "farm.py": '''"""The project's own module named farm."""
import cuda.tile as ct

from ctbuild import Tensor

WORKLOADS = [{"X": Tensor((1024,), "float32"), "OUT": Tensor((1024,), "float32")}]


@ct.function
def twice(t):
    return t * 2.0
''',
    "user_kernels.py": '''import cuda.tile as ct

import cache, farm  # noqa: E401 - the project's own, beside this file
import ctbuild
from ctbuild import Product


@ctbuild.autotune(space=Product(TILE=cache.TILES), grid=lambda cfg, w: (ct.cdiv(1024, cfg.TILE),),
                  default={"TILE": cache.TILES[0]}, workloads=farm.WORKLOADS)
@ct.kernel
def user_scale(X, OUT, TILE: ct.Constant[int]):
    x = ct.load(X, index=(ct.bid(0),), shape=(TILE,), padding_mode=ct.PaddingMode.ZERO)
    ct.store(OUT, index=(ct.bid(0),), tile=farm.twice(x))
''',
}

#: Serving, inside the project: which files the names resolve to, and the call's resolution on
#: the CPU (tensor specs stand for the arguments) or, with "launch", a real call on the GPU.
SERVE = r'''
import json, sys
import ctbuild.cache, ctbuild.farm  # noqa: E401 - ctbuild's, loaded before the project's
import user_kernels
from ctbuild import Tensor
names = ("cache", "farm", "ctbuild.cache", "ctbuild.farm")
out = {"files": {m: sys.modules[m].__file__ for m in names}}
if sys.argv[1:] == ["launch"]:
    import torch
    x = torch.arange(1024, dtype=torch.float32, device="cuda")
    y = torch.empty_like(x)
    user_kernels.user_scale(x, y)
    torch.cuda.synchronize()
    out["doubled"] = bool(torch.equal(y, 2 * x))
    out["cubin_from"] = user_kernels.user_scale.runtime.provenance()["entries"][0]["cubin_from"]
else:
    spec = Tensor((1024,), "float32")
    res = user_kernels.user_scale.runtime.resolve((spec, spec), arch="sm_90", gpu="H100")
    out.update(config=res.config.to_json(), cubin_from=res.cubin_from)
print(json.dumps(out))
'''


def _run(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("CTBUILD_", "RAY_"))}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=cwd,
                          env={**clean, **env}, timeout=300)


def _json(proc: subprocess.CompletedProcess) -> dict:
    assert proc.returncode == 0, \
        f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The project, precompiled on local worker processes from inside it (its directory first
    on the driver's and the workers' sys.path): (project, cache)."""
    tmp = tmp_path_factory.mktemp("user_names")
    project, cache = tmp / "proj", tmp / "built"
    project.mkdir()
    for name, text in FILES.items():
        (project / name).write_text(text)
    proc = _run(["-m", "ctbuild", "precompile", "--config", "ctbuild.toml", "--cache", str(cache),
                 "--farm", "local", "--workers", "1", "--json"], cwd=project)
    out = _json(proc)
    assert (out["jobs"], out["compiled"], out["failed"]) == (2, 2, 0), out
    return project, cache


def test_plan_imports_the_projects_cache_and_farm(built: tuple[Path, Path]) -> None:
    """Run from elsewhere (ctbuild's packages load first): the kernel still gets the project's
    tile sizes (cache.py) and workload (farm.py)."""
    project, _ = built
    plan = _json(_run(["-m", "ctbuild", "plan", "--config", str(project / "ctbuild.toml"),
                       "--json"], cwd=project.parent))
    (kernel,) = plan["kernels"]
    (entry,) = kernel["entries"]
    assert (kernel["name"], entry["configs"], entry["default"]) == ("user_scale", 2, {"TILE": 32})
    assert entry["workload"]["X"]["tensor"] == [1024]


def test_serving_finds_the_cubins_the_projects_modules_built(built: tuple[Path, Path]) -> None:
    """Strict serving inside the project resolves to the CUBIN precompile stored (the kernel's
    fingerprint, which follows farm.twice, matches), each name resolving to its owner's file."""
    project, cache = built
    got = _json(_run(["-c", SERVE], cwd=project, CTBUILD_CACHE_DIR=str(cache),
                     CTBUILD_MODE="strict"))
    files = got["files"]
    assert (files["cache"], files["farm"]) == (str(project / "cache.py"), str(project / "farm.py"))
    assert files["ctbuild.cache"].endswith(os.path.join("ctbuild", "cache", "__init__.py"))
    assert files["ctbuild.farm"].endswith(os.path.join("ctbuild", "farm", "__init__.py"))
    assert (got["config"], got["cubin_from"]) == ({"TILE": 32}, "cache")


@pytest.mark.gpu
def test_a_gpu_call_runs_the_projects_device_function(built: tuple[Path, Path]) -> None:
    project, cache = built
    got = _json(_run(["-c", SERVE, "launch"], cwd=project, CTBUILD_CACHE_DIR=str(cache),
                     CTBUILD_MODE="strict"))
    assert got["files"]["farm"] == str(project / "farm.py")
    assert got["doubled"] and got["cubin_from"] == "cache", got
