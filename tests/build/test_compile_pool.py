"""`CompilePool` (``ctbuild tune --compile-missing``'s local pool): its workers never outlive the
process that started them, however it ends. A measuring process skips its interpreter's
teardown after closing it (`ctbuild.tune.session`) and a supervisor kills a stuck one; a worker
left behind blocks forever, holding that process's output open."""
from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import EXAMPLES, ROOT

#: Close a pool whose workers ran a job (one that fails at once: no module of its name),
#: then leave as a measuring process does, without the interpreter's teardown, or as a killed
#: one (``sys.argv[3]``: "kill"; the pool left open).
CLOSE_THEN_EXIT = r'''
import dataclasses, os, signal, sys
from ctbuild.arch import Arch
from ctbuild.cache import Store
from ctbuild.compile.compile_pool import CompilePool
from ctbuild.compile.plan import make_plan
from ctbuild.project import load_project
if __name__ == "__main__":
    project = load_project(sys.argv[2])
    plan = make_plan(project.kernels()[:1], [Arch("sm_90")], "0" * 32, project.cap)
    job = dataclasses.replace(next(iter(plan.jobs.values())), module="no_such_module")
    pool = CompilePool(Store(sys.argv[1]), workers=2)
    pool.submit(job)
    assert list(pool.arrivals([job.key])) == [] and "no_such_module" in pool.errors[job.key]
    print("measured", file=sys.stderr, flush=True)
    if sys.argv[3] == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    pool.close()
    os._exit(0)
'''


@pytest.mark.parametrize("end", ["exit", "kill"])
def test_no_worker_outlives_the_pools_process(tmp_path: Path, end: str) -> None:
    script = tmp_path / "close_then_exit.py"
    script.write_text(CLOSE_THEN_EXIT)
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "cache"),
                           str(EXAMPLES / "ctbuild.toml"), end], capture_output=True, text=True,
                          cwd=ROOT, timeout=60)  # a worker left behind: never returns
    assert proc.returncode == (-signal.SIGKILL if end == "kill" else 0), proc.stderr[-3000:]
    assert "measured" in proc.stderr
