"""Serving coverage on a GPU: runs tests/gpu/coverage_check.py end to end (build, serve with
no tileiras in strict mode, explain agreement, the record -> precompile -> tune loop)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT


@pytest.mark.gpu
@pytest.mark.slow
def test_coverage_check_on_gpu(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "gpu" / "coverage_check.py"),
                           "--workdir", str(tmp_path), "--stage", "all"],
                          capture_output=True, text=True, cwd=ROOT, timeout=1800)
    print(proc.stdout[-20000:])
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-4000:]
    assert "FAIL" not in proc.stdout
