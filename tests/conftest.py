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


#: The toolchain fingerprint runtime tests record in their caches.
RUNTIME_TOOLCHAIN = "e" * 32


@pytest.fixture
def runtime_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A fresh cache with a recorded toolchain, no runtime env vars, and a runtime reset after."""
    from cache import Store
    from ctbuild import runtime
    for var in ("CTBUILD_MODE", "CTBUILD_RECORD", "CTBUILD_DISABLE_AUTOTUNE", "CTBUILD_TOOLCHAIN"):
        monkeypatch.delenv(var, raising=False)
    store = Store(tmp_path / "cache")
    store.put_toolchain(RUNTIME_TOOLCHAIN, {"cuda_tile": "1.7.0", "env": {}, "created": 1.0})
    yield store
    runtime.reset()
