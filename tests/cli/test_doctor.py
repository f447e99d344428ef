"""`ctbuild doctor` reports the real toolchain and catches an unusable cache dir."""
from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from importlib.metadata import version
from pathlib import Path

import pytest
from conftest import run_cli

#: The installed cuda-tile (from its distribution's metadata, not from ctbuild) and the other
#: supported series, whose caches must not serve this one.
CUTILE = version("cuda-tile")
OTHER_CUTILE = "1.7.0" if CUTILE.startswith("1.6.") else "1.6.0"


@pytest.fixture(scope="module")
def build_report(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """`ctbuild doctor --json` on a build machine (no --serving), with a cache dir not made
    yet: (that dir, the report), which several tests read (each run of doctor costs seconds
    of torch and cuTile imports)."""
    cache = tmp_path_factory.mktemp("doctor") / "cache"
    proc = run_cli("doctor", "--cache", str(cache), "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return cache, json.loads(proc.stdout)


def test_doctor_reports_toolchain(build_report: tuple[Path, dict]) -> None:
    _, report = build_report
    assert report["cuda_tile"] == CUTILE
    assert len(report["toolchain"]["fingerprint"]) == 32
    assert Path(report["toolchain"]["paths"]["tileiras"]).name == "tileiras"
    assert report["toolchain"]["bytecode_version"] == "13.4"
    assert report["cache"]["writable"] is True
    assert report["problems"] == []


def test_doctor_flags_unusable_cache_dir(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    proc = run_cli("doctor", "--cache", str(blocker / "cache"))
    assert proc.returncode == 1
    assert "PROBLEM: cache dir" in proc.stdout


def test_unclassified_cutile_env_var_is_an_error(tmp_path: Path) -> None:
    proc = run_cli("doctor", "--cache", str(tmp_path), env={"CUDA_TILE_SOMETHING_NEW": "1"})
    assert proc.returncode == 1
    assert "unclassified cuTile env var(s) CUDA_TILE_SOMETHING_NEW" in proc.stdout


def test_key_env_var_changes_fingerprint(build_report: tuple[Path, dict]) -> None:
    cache, base = build_report

    def doctor(env: dict[str, str]) -> dict:
        return json.loads(run_cli("doctor", "--json", "--cache", str(cache), env=env).stdout)

    with ThreadPoolExecutor(max_workers=2) as pool:  # two independent processes at once
        debug, neutral = pool.map(doctor, [{"EXPERIMENTAL_CUDA_TILE_DEBUG_BUILD": "1"},
                                           {"CUDA_TILE_LOGS": "CUTILEIR"}])
    assert debug["toolchain"]["fingerprint"] != base["toolchain"]["fingerprint"]
    assert neutral["toolchain"]["fingerprint"] == base["toolchain"]["fingerprint"]


def test_cuda_home_with_older_toolkit_is_flagged(tmp_path: Path, monkeypatch) -> None:
    """A system tileiras (not the pip one) uses $CUDA_HOME's ptxas: an older one breaks it."""
    from ctbuild import toolchain
    real_tileiras, _ = toolchain.find_tileiras()
    home = tmp_path / "cuda-13.0"
    (home / "bin").mkdir(parents=True)
    ptxas = home / "bin" / "ptxas"
    ptxas.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 13.0, V13.0.48'\n")
    ptxas.chmod(0o755)
    monkeypatch.setenv("CUDA_HOME", str(home))
    monkeypatch.setattr(toolchain, "find_tileiras", lambda: (real_tileiras, True))
    problem = toolchain.cuda_home_problem()
    assert problem is not None and "13.0" in problem and "unset CUDA_HOME" in problem
    monkeypatch.setattr(toolchain, "find_tileiras", lambda: (real_tileiras, False))
    assert toolchain.cuda_home_problem() is None  # the pip tileiras ignores CUDA_HOME


def test_serving_mode_checks_the_cache_toolchain(tmp_path: Path) -> None:
    from ctbuild.cache import Store
    from ctbuild.toolchain import probe
    cache = tmp_path / "cache"
    with Store(cache) as store:
        store.put_toolchain("old", {**probe().profile, "cuda_tile": OTHER_CUTILE})
    report = json.loads(run_cli("doctor", "--serving", "--json", "--cache", str(cache)).stdout)
    assert report["cache"]["built_with"] == [OTHER_CUTILE]
    assert any(f"was built with cuda-tile {OTHER_CUTILE}, but this process has cuda-tile "
               f"{CUTILE}: serve with the build's version (pip install 'cuda-tile=="
               f"{OTHER_CUTILE}'), or rebuild this cache under {CUTILE}" in p
               for p in report["problems"]), report["problems"]
    with Store(cache) as store:
        store.put_toolchain(probe().fingerprint, probe().profile)
    report = json.loads(run_cli("doctor", "--serving", "--json", "--cache", str(cache)).stdout)
    assert report["cache"]["toolchain"] == probe().fingerprint
    assert not any("toolchain" in p for p in report["problems"])
    assert not any("CTBUILD_" in p for p in report["problems"])
    # What the runtime would refuse at its first call is a problem here already.
    bad = run_cli("doctor", "--serving", "--cache", str(cache),
                  env={"CTBUILD_MAX_LAYOUTS": "lots", "CTBUILD_VERIFY": "everything"})
    assert bad.returncode == 1
    assert "PROBLEM: CTBUILD_MAX_LAYOUTS='lots': give a whole number" in bad.stdout
    assert "PROBLEM: CTBUILD_VERIFY" in bad.stdout


def test_doctor_says_which_hot_path_runs_and_why(tmp_path: Path,
                                                 build_report: tuple[Path, dict],
                                                 monkeypatch) -> None:
    """On a serving node: the C hot path where it is built (as here, where a C compiler is),
    else why not; never a problem. A build machine's report leaves it out (no torch import)."""
    from ctbuild.serve import layout_guard
    on = json.loads(run_cli("doctor", "--serving", "--json", "--cache", str(tmp_path)).stdout)
    want = "C (" if layout_guard.native_guard() is not None else "Python"
    assert on["hot_path"].startswith(want)
    assert not any("hot path" in p or "C module" in p for p in on["problems"])
    assert "hot_path" not in build_report[1]
    monkeypatch.setenv("CTBUILD_NATIVE_GUARD", "0")  # what doctor reads, in this process
    layout_guard.native_guard.cache_clear()
    try:
        off = layout_guard.native_status()
    finally:
        monkeypatch.undo()
        layout_guard.native_guard.cache_clear()
    assert off.startswith("Python (keys)") and "CTBUILD_NATIVE_GUARD=0" in off


def test_serving_outside_the_project_finds_the_cache_its_kernels_do(tmp_path: Path) -> None:
    """Run outside the project, doctor --serving finds no config; it says how to check the
    cache a service importing the kernels finds (upward from their folder), and --module does."""
    from ctbuild.cache import Store
    project = tmp_path / "proj"
    (project / "kern").mkdir(parents=True)
    (project / "kern" / "__init__.py").write_text("")
    (project / "kern" / "k.py").write_text("")
    (project / "ctbuild.toml").write_text('modules = ["kern.k"]\ncache_dir = "built"\n')
    Store(project / "built").close()
    away = tmp_path / "away"
    away.mkdir()
    env = {"PYTHONPATH": str(project), "CTBUILD_CACHE_DIR": "", "CTBUILD_CONFIG": ""}
    plain, found = (json.loads(run_cli(*args, cwd=away, env=env).stdout) for args in (
        ("doctor", "--serving", "--json"),
        ("doctor", "--serving", "--json", "--module", "kern.k")))
    assert any("pass --module KERNEL_MODULE" in p for p in plain["problems"]), plain
    assert found["cache"]["dir"] == str(project / "built"), found["cache"]
    assert not any("no cache" in p for p in found["problems"]), found["problems"]
    missing = run_cli("doctor", "--serving", "--module", "no_such.kernels", cwd=away, env=env)
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1
    assert "--module no_such.kernels: no such module here" in missing.stderr
