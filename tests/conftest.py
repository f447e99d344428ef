"""Shared test setup: ``gpu`` tests skip cleanly where no CUDA GPU is visible."""
from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

T = TypeVar("T")
ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


@functools.lru_cache(maxsize=1)
def cuda_available() -> bool:
    try:
        import torch
        return bool(torch.cuda.is_available())
    except Exception:
        return False


def can_build_c() -> bool:
    """Whether `pip install` can build the package's C module here: a C compiler and this
    Python's headers."""
    import shutil
    import sysconfig
    return shutil.which("cc") is not None and \
        (Path(sysconfig.get_paths()["include"]) / "Python.h").exists()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if cuda_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (none visible)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def stub_libcuda_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory holding a freshly compiled stub ``libcuda.so.1`` (tests/stub_libcuda.c):
    with it on ``LD_LIBRARY_PATH`` cuTile's real dispatcher runs on a CPU machine."""
    import shutil
    import subprocess
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("gcc not found: cannot build the stub libcuda.so.1 for the parity test")
    out = tmp_path_factory.mktemp("stub_libcuda")
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", str(out / "libcuda.so.1"),
                    str(ROOT / "tests" / "stub_libcuda.c")], check=True, capture_output=True,
                   text=True)
    return out


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


def at_once(*calls: Callable[[], T]) -> list[T]:
    """Independent calls, two at a time; their results in order. Most of a CLI test's time is
    one child process importing torch and cuTile on one core: two such children at once keep a
    core busy that would wait (also under `make test`'s two workers, whose files often wait on
    one child each)."""
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = [pool.submit(call) for call in calls]
        return [f.result() for f in futures]


def python_json(code: str, *, env: dict[str, str], cwd: Path | None = None,
                timeout: float = 300) -> Any:
    """Run ``python -c code`` in a fresh process with ``env``; it must exit 0, and its last line
    of output, parsed as JSON, is returned (what the code printed of its process's state)."""
    import json
    import subprocess
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


#: The toolchain fingerprint runtime tests record in their caches.
RUNTIME_TOOLCHAIN = "e" * 32


@pytest.fixture
def runtime_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A fresh cache with a recorded toolchain, no runtime env vars, and a runtime reset after."""
    from ctbuild import cutile, runtime
    from ctbuild.cache import Store
    for var in ("CTBUILD_MODE", "CTBUILD_RECORD", "CTBUILD_DISABLE_AUTOTUNE", "CTBUILD_TOOLCHAIN"):
        monkeypatch.delenv(var, raising=False)
    store = Store(tmp_path / "cache")
    store.put_toolchain(RUNTIME_TOOLCHAIN, {"cuda_tile": cutile.version(), "env": {},
                                            "created": 1.0})
    yield store
    runtime.reset()


@pytest.fixture
def stub_gpu(runtime_store, monkeypatch: pytest.MonkeyPatch) -> list[tuple]:
    """The runtime on a CPU: ``ct.launch`` records its arguments, device 0 is an sm_90 GPU
    (an H100), the stream is 0. Returns the list of launches."""
    import ctbuild.serve.kernel_runtime as rtmod
    from ctbuild import runtime
    from ctbuild.serve.resolve import Resolver
    launches: list[tuple] = []
    monkeypatch.setattr(rtmod.ct, "launch", lambda *a: launches.append(a))
    monkeypatch.setattr(Resolver, "_device_for", lambda self, w: 0)
    ctx = runtime.configure(store=runtime_store, mode="default", disable_autotune=True)
    monkeypatch.setattr(ctx, "device_info", lambda d: ("sm_90", "NVIDIA H100 80GB HBM3"))
    monkeypatch.setattr(rtmod, "current_stream_getter", lambda: (lambda d: 0))
    return launches


def count_slow_calls(tuned, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Appends 1 to the returned list whenever a call of ``tuned`` takes the slow path."""
    rt = tuned.runtime
    slow: list[int] = []
    original = rt._first_call
    monkeypatch.setattr(rt, "_first_call", lambda *a, **k: (slow.append(1), original(*a, **k)))
    return slow
