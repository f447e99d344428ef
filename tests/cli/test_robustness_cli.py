"""Typos, broken kernel modules and closed pipes end in one line and the right exit code, never a
traceback. Every case runs the real `ctbuild` in a subprocess on a tiny fixture project."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import at_once

from ctbuild.cache import Store

REPO = Path(__file__).resolve().parents[2]
PROJECT = REPO / "tests" / "fixtures" / "robust_project"
KERNEL = "robust_tiny.py"


def env(**extra: str) -> dict:
    full = {k: v for k, v in os.environ.items() if k != "CTBUILD_CACHE_DIR" and not k.startswith("CUDA_TILE_")}
    full.update({"PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1", **extra})
    return full


def ctbuild(*args: str, cwd: Path, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ctbuild", *args], cwd=cwd, env=env(**extra),
                          capture_output=True, text=True, timeout=300)


def one_line_error(proc: subprocess.CompletedProcess, code: int) -> str:
    """The error message, after checking: exit ``code``, no traceback, one 'ctbuild: error:' line."""
    assert proc.returncode == code, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1, proc.stderr
    return errors[0]


@pytest.fixture
def project(tmp_path) -> Path:
    shutil.copytree(PROJECT, tmp_path / "project")
    return tmp_path / "project"


BROKEN_KERNELS = [
    # (what the user wrote wrong, how the source is changed, what the message must name)
    ("syntax error", ("bid = ct.bid(0)", "bid = ct.bid(0) +"), ["SyntaxError", f"{KERNEL}:"]),
    ("name error at import", ("import ctbuild\n", "import ctbuild\nundefined_helper()\n"), ["NameError", f"{KERNEL}:"]),
    ("unknown dtype", ('Tensor((4096,), "float32"), "OUT"', 'Tensor((4096,), "float128"), "OUT"'),
     ["float128", f"{KERNEL}:"]),
    ("unknown workload argument in grid", ("w.X.shape", "w.XX.shape"), ["XX", f"{KERNEL}:"]),
    ("exception in grid", ("grid=lambda cfg, w: (", "grid=lambda cfg, w: (1 // 0, "),
     ["ZeroDivisionError", f"{KERNEL}:"]),
]


def ctbuild_at_once(calls: list[tuple[tuple[str, ...], Path]]) -> list[subprocess.CompletedProcess]:
    """``ctbuild ARGS`` in each (ARGS, cwd), two processes at a time (`at_once`)."""
    return at_once(*(lambda call=call: ctbuild(*call[0], cwd=call[1]) for call in calls))


@pytest.fixture(scope="module")
def broken_plans(tmp_path_factory) -> dict[str, subprocess.CompletedProcess]:
    """`ctbuild plan` of the fixture project with each of `BROKEN_KERNELS` (a copy each)."""
    projects = []
    for what, change, _ in BROKEN_KERNELS:
        project = tmp_path_factory.mktemp("broken") / "project"
        shutil.copytree(PROJECT, project)
        source = project / KERNEL
        text = source.read_text()
        assert change[0] in text, what
        source.write_text(text.replace(change[0], change[1], 1))
        projects.append(project)
    procs = ctbuild_at_once([(("plan",), project) for project in projects])
    return {what: proc for (what, _, _), proc in zip(BROKEN_KERNELS, procs)}


@pytest.mark.parametrize("what, change, named", BROKEN_KERNELS, ids=[b[0] for b in BROKEN_KERNELS])
def test_a_broken_kernel_module_is_one_line_naming_file_and_line(broken_plans, what, change, named):
    line = one_line_error(broken_plans[what], 2)
    for word in named:
        assert word in line, line


def test_bad_flags_and_config_paths_are_refused_with_a_clear_message(project, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    arch1, arch2, timeout, parent, dir_config, no_config = ctbuild_at_once([
        (("plan", "--arch", "sm_90,,"), project),
        (("plan", "--arch", ""), project),
        (("precompile", "--compile-timeout", "inf"), project),
        (("plan", "--config", str(project.parent)), project),
        (("plan", "--config", str(project)), tmp_path),
        (("plan",), empty),
    ])
    for proc in (arch1, arch2):
        assert "empty arch" in one_line_error(proc, 2)
    assert "finite" in one_line_error(timeout, 2)
    assert "is a directory" in one_line_error(parent, 2)
    line = one_line_error(dir_config, 2)
    assert "is a directory" in line and f"--config {project / 'ctbuild.toml'}" in line
    line = one_line_error(no_config, 2)
    assert "no config file found" in line and str(empty) in line


def test_cache_errors_and_unknown_cuda_tile_vars_are_one_line(project, tmp_path):
    foreign = tmp_path / "foreign-cache"
    foreign.mkdir()
    (foreign / "ctbuild-cache.json").write_text('{"format": "ctbuild-cache", "version": 99}')
    cache = tmp_path / "cache"
    Store(cache).close()
    foreign_run, doctor = at_once(
        lambda: ctbuild("precompile", "--cache", str(foreign), cwd=project),
        lambda: ctbuild("doctor", "--serving", "--cache", str(cache), cwd=project,
                        CUDA_TILE_SOMETHING_NEW="1"))
    line = one_line_error(foreign_run, 2)
    assert "layout" in line and "99" in line
    line = one_line_error(doctor, 2)
    assert "CUDA_TILE_SOMETHING_NEW" in line


def closed_pipe_run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """Run ctbuild with stdout a pipe whose reader is already gone: every write fails (EPIPE)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run([sys.executable, "-m", "ctbuild", *args], cwd=cwd, env=env(), stdout=write_end,
                              stderr=subprocess.PIPE, text=True, timeout=300)
    finally:
        os.close(write_end)


def test_output_into_a_closed_pipe_exits_quietly(project, tmp_path):
    cache = tmp_path / "cache"
    with Store(cache) as store:
        for i in range(50):
            store.put_compile(f"key{i}", b"x" * (i + 1), symbol="s", meta={"kernel": "k", "arch": "sm_90"})
    runs = [("plan",), ("doctor", "--json"), ("cache", "ls", "--cache", str(cache))]
    procs = at_once(*(lambda args=args: closed_pipe_run(*args, cwd=project) for args in runs))
    for args, proc in zip(runs, procs):
        assert proc.returncode == 0 and proc.stderr.strip() == "", (args, proc.stderr)


#: Runs of `plan | head -1`, all at once. Whether plan's later writes find head gone is a race;
#: the case of every write failing is checked deterministically above (a reader gone from the
#: start) and both end in the same handler, so these runs are a few draws of the race as a
#: user's pipe has it, not a search for it. (20 runs, four at a time, took a third of this
#: module's time: each is seconds of imports.)
HEAD_RUNS = 4


def test_plan_into_head_exits_0_without_traceback(project):
    script = f"{sys.executable} -m ctbuild plan | head -1 >/dev/null; echo ${{PIPESTATUS[0]}}"

    def once(_: int) -> tuple[str, str]:
        proc = subprocess.run(["bash", "-c", script], cwd=project, env=env(), capture_output=True, text=True,
                              timeout=300)
        return proc.stdout.strip(), proc.stderr

    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(once, range(HEAD_RUNS)))
    assert [code for code, _ in results] == ["0"] * HEAD_RUNS, results
    assert not [err for _, err in results if err.strip()], results


def test_a_subcommand_imports_only_its_own_module(tmp_path):
    cache = tmp_path / "cache"
    Store(cache).close()
    code = ("import sys; from ctbuild.cli import main; main(['cache', 'stats', '--cache', sys.argv[1]]); "
            "loaded = sorted(m for m in sys.modules if m.startswith(('ctbuild.commands.', 'ray', 'ctbuild.farm')));"
            "print('LOADED', loaded)")
    proc = subprocess.run([sys.executable, "-c", code, str(cache)], env=env(), capture_output=True, text=True,
                          timeout=120)
    loaded = proc.stdout.split("LOADED", 1)[1]
    assert "ctbuild.commands.cache" in loaded, proc.stdout + proc.stderr
    for other in ("plan", "precompile", "tune", "doctor"):
        assert f"ctbuild.commands.{other}'" not in loaded, loaded
    assert "ray" not in loaded and "farm" not in loaded, loaded


def test_a_deleted_working_directory_is_named(tmp_path: Path) -> None:
    """Every default path (the cache, the config's search) hangs on the working directory; once
    it is deleted the OS error carries no path ('No such file or directory'), so it is named
    before anything runs."""
    gone = tmp_path / "gone"
    gone.mkdir()
    script = ("import os, sys\nos.chdir(sys.argv[1]); os.rmdir(sys.argv[1])\n"
              "from ctbuild.cli import main\n"
              "sys.exit(main(['plan', '--config', sys.argv[2]]))\n")
    proc = subprocess.run([sys.executable, "-c", script, str(gone), str(PROJECT / "ctbuild.toml")],
                          env=env(), capture_output=True, text=True, timeout=120)
    assert "current directory no longer exists" in one_line_error(proc, 2)
