"""Real kernels build first time: a body naming torch dtypes (as TileGym's do) plans, builds,
and passes the TileIR check's helper process; the plan-time body check covers every class of
jobs (kernel, arch, dtype pattern, hints) and refuses hint values tileiras 13.4 cannot take,
with the declaration's file:line; what fails at precompile is one line per cause. Real cuTile
front end and tileiras; the CLI runs in fresh interpreters where the import order matters."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, at_once, run_cli

from ctbuild.cache import Store
from ctbuild.cli import main
from ctbuild.compile.failures import cause_line
from ctbuild.compile.ir_derive import Setup

PROJECT = ROOT / "tests" / "fixtures" / "torch_dtype_project"
CONFIG = PROJECT / "ctbuild.toml"
HINTS = PROJECT / "hints.toml"
KERNELS = "tests/fixtures/torch_dtype_project/torch_dtype_kernels.py"


def _helper(setup: Setup, jobs: list[dict]) -> list[dict]:
    """The TileIR check's helper process (``python -m ctbuild.compile.ir_derive``, as
    precompile starts one per spare core) on ``jobs``: its answers."""
    stdin = json.dumps(setup.to_json()) + "\n" + json.dumps(jobs) + "\n"
    proc = subprocess.run([sys.executable, "-m", "ctbuild.compile.ir_derive"], input=stdin,
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    lines = proc.stdout.splitlines()
    assert proc.returncode == 0 and json.loads(lines[0]) == "ready", proc.stderr[-3000:]
    return json.loads(lines[1])


def test_a_body_naming_torch_dtypes_plans_builds_and_checks_alike(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    plan, build = at_once(
        lambda: run_cli("plan", "--config", str(CONFIG)),
        lambda: run_cli("precompile", "--config", str(CONFIG), "--cache", str(cache),
                        "--farm", "local", "--workers", "2", "--json"))
    assert plan.returncode == 0, plan.stderr  # was: TypeCheckingError ... torch.dtype
    assert "silu_and_mul" in plan.stdout
    out = json.loads(build.stdout)
    assert build.returncode == 1 and (out["compiled"], out["failed"]) == (4, 2), build.stderr
    # tile_sizes' two TILE=96 jobs fail alike: one cause, its own file:line, both jobs counted
    [cause] = out["causes"]
    assert (cause["kernel"], cause["jobs"], cause["where"]) == ("tile_sizes", 2, None)
    assert cause_line(cause).startswith(
        "tile_sizes, 2 jobs (sm_90 float32 {TILE=96}, sm_90 float16 {TILE=96}): "
        f"TypeCheckingError: {KERNELS}:")
    assert "is not a power of two" in cause["error"]

    with Store(cache, readonly=True) as store:
        entries = {k: m for k, m in store.compile_entries() if m["kernel"] == "silu_and_mul"}
        version = store.get_toolchain(out["toolchain"])["bytecode_version"]
    assert len(entries) == 2
    jobs = [{"key": k, **{f: m.get(f) for f in ("kernel", "module", "config", "workload",
                                                 "arch", "weaken")}} for k, m in entries.items()]
    setup = Setup([str(PROJECT)], ["torch_dtype_kernels"], out["toolchain"], version)
    found = {r["key"]: r for r in _helper(setup, jobs)}
    # the helper derives the TileIR the build recorded (was: the front end failed there, a
    # false "fingerprint hole", and precompile rebuilt the CUBINs)
    assert {k: found[k].get("digest") for k in entries} == \
        {k: m["tileir"] for k, m in entries.items()}, found


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[str]]:
    """``ctbuild ARGV`` in this process: (exit status, stderr's lines)."""
    code = main(list(argv))
    return code, [line for line in capsys.readouterr().err.splitlines() if line.strip()]


def test_the_body_check_covers_each_class_and_refuses_hints_at_plan(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
        ) -> None:
    """hint_kernels.warps passes on its default config and first workload (all the check
    used to derive); its int32 workload and num_worker_warps 1 and 2 fail: one line each,
    at plan and at precompile, before anything is compiled."""
    monkeypatch.chdir(ROOT)
    where = "tests/fixtures/torch_dtype_project/hint_kernels.py"
    expected = [
        f"kernel 'warps' (hint_kernels): hint num_worker_warps=1: {where}:13: "
        "UnsupportedFeatureError: num_worker_warps=1 requires tileiras 13.5 or later. Current "
        "version is 13.4. (in 1 of 6 job classes: sm_90 float32 {num_worker_warps=1})",
        f"kernel 'warps' (hint_kernels): hint num_worker_warps=2: {where}:13: "
        "UnsupportedFeatureError: num_worker_warps=2 requires tileiras 13.5 or later. Current "
        "version is 13.4. (in 1 of 6 job classes: sm_90 float32 {num_worker_warps=2})",
        f"kernel 'warps' (hint_kernels): kernel body: {where}:20:4: TypeCheckingError: Stored "
        "tile is incompatible with array's dtype: cannot implicitly cast float32 to int32",
    ]
    for argv in (("plan",), ("precompile", "--cache", str(tmp_path / "cache"))):
        code, lines = cli(capsys, *argv, "--config", str(HINTS))
        assert code == 2 and len(lines) == 3, lines
        assert [line.removeprefix("ctbuild: error: ") for line in lines[:2]] == expected[:2]
        assert lines[2].removeprefix("ctbuild: error: ").startswith(expected[2]), lines[2]
        assert "(in 3 of 6 job classes: sm_90 int32 {num_worker_warps=4}, " in lines[2]
