"""Kernels whose identity rests on their TileIR (issue 37), through real builds: plan names
what they read; a serving process verifies their CUBINs at the first load with no setting,
while a kernel the fingerprint covers never loads cuTile's compiler; precompile's check memo
keys on the environment variable and the file they read; a JIT write-back never lands on a key
that holds other code and records its TileIR; ``cache verify --identity`` checks every entry.

Each test builds four fixture kernels (``fs_env`` reads FS_SCALE, ``fs_file`` a data file,
``fs_getattr_dynamic`` a computed getattr, ``fs_method`` is covered by its fingerprint): eight
small CUBINs, about 3 s."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "fixtures" / "farm_project"))
from cli_helpers import ROOT, explain, precompile  # noqa: E402

from ctbuild.cache import Store  # noqa: E402

FIXTURE = Path(__file__).parents[1] / "fixtures" / "identity_failsafe"
KERNELS = ["fs_env", "fs_file", "fs_getattr_dynamic", "fs_method"]

#: Run with (project, action): look each kernel's TILE=64 CUBIN up as a launch does, and say
#: which class served it and whether cuTile's compiler was loaded by then; "writeback": write
#: a JIT result back under fs_method's key (new after an edit) and under fs_env's.
SERVE = r'''
import json, sys
import torch
sys.path[:0] = [sys.argv[1], sys.argv[1] + "/site"]
from ctbuild.project import load_project
from ctbuild.serve.context import context
from ctbuild.serve.misses import workload_json
from ctbuild.signature import derive_signature
from ctbuild.space import Config
kernels = {k.name: k for k in load_project(sys.argv[1] + "/ctbuild.toml").kernels()}
ctx, got = context(), {}
for name in ("fs_method", "fs_env", "fs_file", "fs_getattr_dynamic"):
    k = kernels[name]
    cfg = Config({"TILE": 64}, name)
    w = k.workloads[0]
    sig = derive_signature(k.kernel, k.kernel_args(cfg, w))
    if sys.argv[2] == "writeback":
        key = ctx.source.key_for(k, cfg, sig, "sm_90")
        got[name] = ctx.write_back.put(k, cfg, key, b"jit cubin", sig.symbol, "sm_90", sig,
                                       workload_json(w))
        continue
    found = ctx.source.lookup_class(k, cfg, sig, "sm_90")
    got[name] = [found and found[2], "cuda.tile._compile" in sys.modules]
print(json.dumps(got))
'''


def _precompile(config: Path, cache: Path, **env: str) -> tuple[dict, str]:
    proc, _, out = precompile("--config", str(config), "--cache", str(cache), "--json",
                              "--workers", "1", *(f"--kernel={k}" for k in KERNELS), env=env)
    assert proc.returncode == 0, explain(proc)
    return out, proc.stderr


def _serve(project: Path, cache: Path, action: str, **env: str) -> tuple[dict, str]:
    proc = subprocess.run([sys.executable, "-c", SERVE, str(project), action],
                          capture_output=True, text=True, cwd=ROOT, timeout=300,
                          env={**os.environ, "CTBUILD_CACHE_DIR": str(cache),
                               "CTBUILD_MODE": "strict", **env})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert text.count(old) == 1, old
    path.write_text(text.replace(old, new))


@pytest.fixture
def built(tmp_path: Path) -> tuple[Path, Path]:
    """This test's own copy of the fixture, built (a built cache is not copied elsewhere:
    fs_file's path is a value its fingerprint reads, so another checkout path is another
    key)."""
    shutil.copytree(FIXTURE, tmp_path / "proj")
    out, _ = _precompile(tmp_path / "proj" / "ctbuild.toml", tmp_path / "cache")
    assert out["compiled"] == out["jobs"] == 2 * len(KERNELS)
    return tmp_path / "proj", tmp_path / "cache"


def test_plan_names_what_a_marked_kernel_reads() -> None:
    proc = subprocess.run([sys.executable, "-m", "ctbuild", "plan", "--config",
                           str(FIXTURE / "ctbuild.toml")], capture_output=True, text=True,
                          cwd=ROOT, timeout=300)
    assert proc.returncode == 0, explain(proc)
    notes = [line for line in proc.stdout.splitlines() if "identity by TileIR" in line]
    assert [n.split(":")[1].strip() for n in notes] == ["fs_getattr_dynamic", "fs_env",
                                                       "fs_file"]
    assert "reads the environment variable FS_SCALE" in notes[1]
    assert "scale.txt" in notes[2]


def test_a_serving_process_verifies_marked_kernels_by_tileir(built: tuple[Path, Path]) -> None:
    """Unchanged, every CUBIN is served, and the covered kernel did not load the compiler. With
    FS_SCALE set, the data file and the getattr'd constant edited (the keys unchanged), no
    CUBIN of a marked kernel is served, strict mode and no CTBUILD_VERIFY; the covered kernel
    still is."""
    project, cache = built
    same, _ = _serve(project, cache, "lookup")
    assert same == {"fs_method": ["exact", False], "fs_env": ["exact", True],
                    "fs_file": ["exact", True], "fs_getattr_dynamic": ["exact", True]}
    _edit(project / "scale.txt", "2.0", "2.5")
    _edit(project / "fsconsts.py", "GAIN = 3.0", "GAIN = 3.5")
    changed, log = _serve(project, cache, "lookup", FS_SCALE="2.5")
    assert changed == {"fs_method": ["exact", False], "fs_env": [None, True],
                       "fs_file": [None, True], "fs_getattr_dynamic": [None, True]}
    assert log.count("identity by TileIR") == 6 and "FS_SCALE" in log  # exact and generic
    assert "not serving it" in log


def test_precompile_remembers_marked_kernels_under_what_they_read(
        built: tuple[Path, Path]) -> None:
    project, cache = built
    config = project / "ctbuild.toml"
    noop, _ = _precompile(config, cache)
    assert (noop["compiled"], noop["ir_check"]["derived"]) == (0, 0)
    env, log = _precompile(config, cache, FS_SCALE="2.5")
    assert env["compiled"] == 2 and env["ir_check"]["derived"] == 2
    assert {m["kernel"] for m in env["ir_check"]["mismatches"]} == {"fs_env"}
    assert "identity by TileIR: fs_env reads the environment variable FS_SCALE" in log
    assert "fingerprint hole" not in log
    _edit(project / "scale.txt", "2.0", "2.5")
    data, _ = _precompile(config, cache, FS_SCALE="2.5")
    assert data["compiled"] == 2
    assert {m["kernel"] for m in data["ir_check"]["mismatches"]} == {"fs_file"}
    again, _ = _precompile(config, cache, FS_SCALE="2.5")
    assert (again["compiled"], again["ir_check"]["derived"]) == (0, 0)


def _verify(config: Path, cache: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ctbuild", "cache", "verify", "--identity",
                           "--config", str(config), "--cache", str(cache), "--json"],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)


def test_write_back_never_replaces_other_code_and_verify_checks_every_entry(
        built: tuple[Path, Path]) -> None:
    """After an edit of fs_method (a new key) and FS_SCALE set (fs_env's key holds other
    code): a JIT result is written back under fs_method's new key, with its TileIR digest and
    workload, never under fs_env's. verify --identity then checks all nine entries and fails
    on fs_env's (this environment compiles other code) and on an entry without a digest."""
    project, cache = built
    config = project / "ctbuild.toml"
    _edit(project / "fskernels" / "kern.py", "CFG = Cfg(scale=2.0)", "CFG = Cfg(scale=2.5)")
    before = dict(Store(cache).compile_entries())
    wrote, _ = _serve(project, cache, "writeback", CTBUILD_MODE="default", FS_SCALE="2.5")
    assert wrote == {"fs_method": True, "fs_env": False, "fs_file": False,
                     "fs_getattr_dynamic": False}
    with Store(cache) as store:
        after = dict(store.compile_entries())
    new = {k: m for k, m in after.items() if k not in before}
    assert [m["kernel"] for m in new.values()] == ["fs_method"]
    assert all(after[k] == m for k, m in before.items())
    meta = next(iter(new.values()))
    assert meta["source"] == "runtime-jit" and len(meta["tileir"]) == 32 and meta["workload"]
    clean = _verify(config, cache)
    assert clean.returncode == 0, explain(clean)
    assert json.loads(clean.stdout)["checked"] == 7  # fs_method's two old entries: stale
    env = subprocess.run([sys.executable, "-m", "ctbuild", "cache", "verify", "--identity",
                          "--config", str(config), "--cache", str(cache)], capture_output=True,
                         text=True, cwd=ROOT, timeout=300, env={**os.environ, "FS_SCALE": "2.5"})
    assert env.returncode == 1 and env.stdout.count("identity: fs_env ") == 2, explain(env)
    with Store(cache) as store:
        key = next(iter(new))
        hit = store.get_compile(key)
        store.put_compile(key, hit.cubin, symbol=hit.symbol,
                          meta={k: v for k, v in meta.items() if k != "tileir"})
    bare = _verify(config, cache)
    report = json.loads(bare.stdout)
    assert bare.returncode == 1 and report["checked"] == 6
    assert [(u["key"], u["why"]) for u in report["unverifiable"]] == [
        (key, "no TileIR digest recorded")]
