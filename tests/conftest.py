"""Shared test setup: ``gpu`` tests skip cleanly where no CUDA GPU is visible."""
from __future__ import annotations

import functools
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


@functools.lru_cache(maxsize=1)
def cuda_available() -> bool:
    try:
        import torch
        return bool(torch.cuda.is_available())
    except Exception:
        return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if cuda_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (none visible)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def examples_on_path(monkeypatch: pytest.MonkeyPatch) -> Path:
    """Make the example kernels importable (as `ctbuild plan` would from the config)."""
    monkeypatch.syspath_prepend(str(EXAMPLES))
    return EXAMPLES


def run_cli(*args: str, cwd: Path | None = None, env: dict | None = None):
    """Run the real ``ctbuild`` CLI in a subprocess (as users do)."""
    import os
    import subprocess
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-m", "ctbuild", *args], capture_output=True,
                          text=True, cwd=cwd or ROOT, env=full_env, timeout=600)
