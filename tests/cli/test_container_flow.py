"""The container flow of examples/Dockerfile, without a Docker engine.

The Dockerfile's build stage is replayed: its COPY steps into a temporary root, its RUN steps
(examples/build-cache.sh) in a fresh virtualenv, for one arch (``--build-arg ARCHS=sm_90``);
the cache it builds is checked entry by entry (every planned job, its CUBIN, metadata and
toolchain profile, its identity), and a rebuild compiles nothing and starts no Ray. Then the
runtime stage's install step (examples/install-runtime.sh) runs in a second fresh virtualenv,
which must serve from the cache without tileiras. Static checks keep the Dockerfile, the
scripts and pyproject.toml in step.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import venv
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import can_build_c
from dockerfile_reader import (
    ROOT,
    Stage,
    script_defaults,
    stages_by_name,
    strip_run_flags,
    substitute,
)

from ctbuild.cache import Store

BUILD_SCRIPT = "examples/build-cache.sh"
RUNTIME_SCRIPT = "examples/install-runtime.sh"
#: RUN steps of the runtime stage that set up the OS image rather than the project; the fresh
#: venv of the test stands in for them. Any other RUN step must be a script the test runs.
SYSTEM_STEPS = (re.compile(r"^apt-get update\b"), re.compile(r"^python3 -m venv /opt/venv$"),
                re.compile(r'^if \[ -n "\$FRAMEWORK" \]; then python3 -m pip install \$FRAMEWORK; fi$'))


# ---- static checks -------------------------------------------------------------------------------
def test_build_stage_runs_only_the_build_script() -> None:
    build = stages_by_name()["build"]
    assert build.base.startswith("python:3."), build.base
    runs = build.runs()
    assert runs == [f"sh {BUILD_SCRIPT} install", f"sh {BUILD_SCRIPT} precompile"], runs
    assert (ROOT / BUILD_SCRIPT).is_file()
    subprocess.run(["sh", "-n", str(ROOT / BUILD_SCRIPT)], check=True)


def test_build_stage_settings_match_the_script() -> None:
    build = stages_by_name()["build"]
    defaults = script_defaults(ROOT / BUILD_SCRIPT)
    # The Dockerfile's build args are the script's defaults, so running the script by hand
    # builds what the image builds.
    assert build.args["CACHE_DIR"] == defaults["CACHE_DIR"] == "/opt/ctbuild-cache"
    assert build.args["ARCHS"] == defaults["ARCHS"] == "sm_90,sm_100"
    assert defaults["CONFIG"] == "examples/ctbuild.toml"
    assert (ROOT / defaults["CONFIG"]).is_file()
    text = (ROOT / BUILD_SCRIPT).read_text()
    assert 'ctbuild precompile --config "$CONFIG" --arch "$ARCHS" --cache "$CACHE_DIR"' in text


def test_runtime_stage_gets_the_cache_and_no_compiler() -> None:
    stages = stages_by_name()
    build, runtime = stages["build"], stages["runtime"]
    assert runtime.base.startswith("nvidia/cuda:") and "-runtime-" in runtime.base, runtime.base
    cache = build.args["CACHE_DIR"]
    copies = [substitute(a, runtime.args).split() for op, a in runtime.steps if op == "COPY"
              and a.startswith("--from=")]
    assert copies == [["--from=build", cache, cache]], copies
    env = runtime.env()
    assert env["CTBUILD_CACHE_DIR"] == cache
    assert env["CTBUILD_MODE"] in ("default", "strict", "tune")
    for run in runtime.runs():
        assert "tileiras" not in run, run
        if any(p.match(run) for p in SYSTEM_STEPS):
            continue
        assert run == f"sh {RUNTIME_SCRIPT}", f"untested RUN step in the runtime stage: {run}"
    assert f"sh {RUNTIME_SCRIPT}" in runtime.runs()
    assert runtime.args["FRAMEWORK"].startswith("torch=="), runtime.args["FRAMEWORK"]
    cmd = [a for op, a in runtime.steps if op == "CMD"]
    assert cmd and all((ROOT / p).is_file() for p in re.findall(r"examples/[\w./]+", cmd[-1]))


def test_copied_sources_exist() -> None:
    for stage in stages_by_name().values():
        for op, a in stage.steps:
            if op == "COPY" and not a.startswith("--from="):
                for src in a.split()[:-1]:
                    assert (ROOT / src).exists(), f"{stage.name}: COPY {src}: no such path"


# ---- replaying the stages ------------------------------------------------------------------------
def _fresh_venv(path: Path) -> Path:
    venv.EnvBuilder(with_pip=True, clear=True).create(path)
    return path / "bin"


def _env(bin_dir: Path, extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("CTBUILD_CACHE_DIR", "CTBUILD_MODE", "CTBUILD_RECORD", "RAY_ADDRESS",
                        "VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "PIP_USER")}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(bin_dir.parent)
    env.update(extra)
    return env


def _run(cmd: list[str] | str, *, cwd: Path, env: dict[str, str], timeout: float = 600
         ) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout, shell=isinstance(cmd, str))
    assert proc.returncode == 0, (f"{cmd} failed ({proc.returncode}):\n"
                                  f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return proc


def replay(stage: Stage, root: Path, bin_dir: Path, *, run_filter=lambda run: True,
           build_args: dict[str, str] | None = None) -> tuple[Path, dict[str, str]]:
    """Replay WORKDIR/COPY/RUN of a stage under `root` (container paths are mapped into it),
    with ``build_args`` overriding the stage's ARG defaults as ``docker build --build-arg``
    does. Returns the work dir and the environment the RUN steps saw."""
    def mapped(p: str) -> Path:
        return root / p.lstrip("/")
    values = {k: (str(mapped(v)) if v.startswith("/") else v)
              for k, v in {**stage.args, **(build_args or {})}.items() if k != "PATH"}
    env = _env(bin_dir, values)
    workdir = root
    for op, a in stage.steps:
        if op == "WORKDIR":
            workdir = mapped(a)
            workdir.mkdir(parents=True, exist_ok=True)
        elif op == "COPY" and not a.startswith("--from="):
            *srcs, dest = a.split()
            target = workdir / dest if not dest.startswith("/") else mapped(dest)
            for src in srcs:
                s = ROOT / src
                if s.is_dir():  # Docker copies a directory's contents into dest
                    shutil.copytree(s, target, dirs_exist_ok=True,
                                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc",
                                                                  "bundles"))
                else:
                    (target if dest.endswith("/") else target.parent).mkdir(parents=True,
                                                                            exist_ok=True)
                    shutil.copy2(s, target / s.name if dest.endswith("/") else target)
        elif op == "RUN":
            run = strip_run_flags(a)
            if run_filter(run):
                _run(run, cwd=workdir, env=env)
    return workdir, env


def _runtime_stage(runtime: Stage, root: Path) -> tuple[Path, Path, dict[str, str]]:
    """The runtime stage's own steps (a fresh venv, its COPYs, its install script): the
    (bin dir, app dir, environment) they leave."""
    runtime_bin = _fresh_venv(root / "runtime-venv")
    app, renv = replay(runtime, root / "runtime-root", runtime_bin,
                       run_filter=lambda run: not any(p.match(run) for p in SYSTEM_STEPS))
    return runtime_bin, app, renv


@pytest.mark.slow
def test_build_and_runtime_stages_outside_docker(tmp_path: Path) -> None:
    stages = stages_by_name()
    build, runtime = stages["build"], stages["runtime"]
    # The runtime stage installs while the build stage runs, as BuildKit runs the two stages:
    # nothing of the build stage reaches it before its COPY --from=build (the cache, used
    # below). Each pip install is mostly one core; together they use this machine's two.
    with ThreadPoolExecutor(max_workers=1) as pool:
        runtime_stage = pool.submit(_runtime_stage, runtime, tmp_path)
        cache = _build_stage(build, tmp_path)
        runtime_bin, app, renv = runtime_stage.result()
    _serve_from_the_cache(runtime_bin, app, renv, cache)


def _build_stage(build: Stage, tmp_path: Path) -> Path:
    """The build stage's steps, checked; returns the cache it built."""
    # -- build stage: a fresh venv, the same COPYs, the same RUN steps --
    build_bin = _fresh_venv(tmp_path / "build-venv")
    # --build-arg ARCHS=sm_90: the image's two archs double the compiles and nothing the replay
    # checks (the defaults are checked above; test_precompile_incremental builds two archs)
    src, env = replay(build, tmp_path / "build-root", build_bin, build_args={"ARCHS": "sm_90"})
    cache = Path(env["CACHE_DIR"])
    assert cache.is_dir() and cache.is_relative_to(tmp_path)

    # precompiling needed neither torch nor a GPU
    proc = subprocess.run([str(build_bin / "python"), "-c", "import torch"], capture_output=True)
    assert proc.returncode != 0, "the build stage installed torch; precompile must not need it"

    # every planned job is in the cache, built by one toolchain
    plan = json.loads(_run([str(build_bin / "ctbuild"), "plan", "--config",
                            "examples/ctbuild.toml", "--arch", env["ARCHS"], "--json"],
                           cwd=src, env=env).stdout)
    stats = json.loads(_run([str(build_bin / "ctbuild"), "cache", "stats", "--cache", str(cache),
                             "--json"], cwd=src, env=env).stdout)
    assert plan["toolchain"] != "unprobed"
    # configs whose hints tileiras ignores give byte-identical CUBINs: one blob serves them all
    assert stats["compile_entries"] == plan["jobs"] >= stats["blobs"] > 0
    assert stats["toolchains"] == 1
    _check_entries(cache, plan, build_bin)

    # every entry's key still maps to the TileIR it was built from (no fingerprint hole)
    identity = json.loads(_run([str(build_bin / "ctbuild"), "cache", "verify", "--identity",
                                "--config", "examples/ctbuild.toml", "--cache", str(cache),
                                "--json"], cwd=src, env=env).stdout)
    assert identity["checked"] == plan["jobs"] and identity["mismatches"] == [], identity

    # a rebuild with a bundle in examples/bundles imports it and compiles nothing
    bundles = src / "examples" / "bundles"
    bundles.mkdir()
    _run([str(build_bin / "ctbuild"), "cache", "export", "--cache", str(cache), "--arch",
          "sm_90", str(bundles / "h100.tgz")], cwd=src, env=env)
    report = tmp_path / "rebuild.json"
    proc = _run(f"sh {BUILD_SCRIPT} precompile --report {report}", cwd=src, env=env)
    assert "imported examples/bundles/h100.tgz: " in proc.stdout, proc.stdout
    summary = json.loads(report.read_text())["summary"]
    assert summary["compiled"] == 0 and summary["cached"] == plan["jobs"], summary
    assert summary["failed"] == 0 and summary["workers"] == 0  # nothing to compile: no Ray
    return cache


def _check_entries(cache: Path, plan: dict, build_bin: Path) -> None:
    """Every planned job's CUBIN is in the cache, an ELF with its kernel's and arch's metadata,
    built by a toolchain whose profile (what serving nodes select by) names the build's
    cuda-tile."""
    cuda_tile = _run([str(build_bin / "python"), "-c", "from importlib.metadata import version; "
                      "print(version('cuda-tile'))"], cwd=cache, env=os.environ.copy())
    with Store(cache, readonly=True) as store:
        toolchains = store.toolchains()
        entries = list(store.compile_entries())
        assert len(entries) == plan["jobs"]
        kernels = {k["name"] for k in plan["kernels"]}
        for key, _ in entries:
            hit = store.get_compile(key)
            assert hit is not None and hit.cubin[:4] == b"\x7fELF" and hit.symbol, key
            assert hit.meta["kernel"] in kernels and hit.meta["arch"] == "sm_90"
            assert hit.meta["toolchain"] == plan["toolchain"]
    assert set(toolchains) == {plan["toolchain"]}
    profile = toolchains[plan["toolchain"]]
    assert profile["cuda_tile"] == cuda_tile.stdout.strip() and profile["created"]


def _serve_from_the_cache(runtime_bin: Path, app: Path, renv: dict[str, str], cache: Path
                          ) -> None:
    # -- runtime stage: its second fresh venv, with the build stage's cache; serves without
    # tileiras --
    renv["CTBUILD_CACHE_DIR"] = str(cache)
    check = f"""
import importlib.util, json
from ctbuild.cache import Store
from ctbuild import runtime
from ctbuild.toolchain import ToolchainError, find_tileiras
try:
    find_tileiras()
    tileiras = True
except ToolchainError:
    tileiras = False
ctx = runtime.context()
print(json.dumps({{
    "tileiras": tileiras,
    "toolchain": ctx.toolchain_fp,
    "recorded": sorted(Store({str(cache)!r}, readonly=True).toolchains()),
    "mode": ctx.mode,
    "ray": importlib.util.find_spec("ray") is not None,
    "torch": importlib.util.find_spec("torch") is not None,
    "c_module": importlib.util.find_spec("ctbuild.serve._fast_path") is not None,
}}))
"""
    out = json.loads(_run([str(runtime_bin / "python"), "-c", check], cwd=app,
                          env=renv).stdout.strip().splitlines()[-1])
    assert out["tileiras"] is False, "the runtime stage installed the tileiras compiler"
    assert out["toolchain"] is not None and out["recorded"] == [out["toolchain"]], out
    assert out["ray"] is False
    # pip builds the hot path's C module wherever it can (the stage installs gcc, python3-dev)
    assert out["c_module"] is can_build_c(), out
    proc = _run([str(runtime_bin / "ctbuild"), "cache", "verify", "--cache", str(cache)],
                cwd=app, env=renv)
    assert proc.returncode == 0
