"""Joining a separately started Ray head with --address: modules are shipped, CUBINs land."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "fixtures" / "farm_project"))
from cli_helpers import PROJECT, SMALL, explain, free_port, precompile, stop_session  # noqa: E402

from ctbuild.cache import Store  # noqa: E402

RAY = Path(sys.executable).with_name("ray")


@pytest.fixture
def ray_head(tmp_path_factory):
    """`ray start --head --block` in its own session and temp dir (so no other Ray on this
    machine can pick it up by accident); stopped by signalling that process group only."""
    if not RAY.exists():
        pytest.skip("ray CLI not installed next to this Python")
    port = free_port()
    temp = Path(os.environ.get("TMPDIR", "/tmp")) / f"rh{port}"  # short: unix socket paths
    temp.mkdir(exist_ok=True)
    log = tmp_path_factory.mktemp("rayhead") / "head.log"
    env = {**os.environ, "RAY_AUTH_MODE": "token"}
    env.pop("RAY_ADDRESS", None)
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [str(RAY), "start", "--head", "--port", str(port), "--node-ip-address", "127.0.0.1",
             "--num-cpus", "2", "--disable-usage-stats", "--include-dashboard=false",
             "--temp-dir", str(temp), "--block"],
            stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while "Ray runtime started" not in log.read_text():
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"ray start failed:\n{log.read_text()[-3000:]}")
            time.sleep(0.3)
        yield f"127.0.0.1:{port}"
    finally:
        stop_session(proc)
        subprocess.run(["rm", "-rf", str(temp)], check=False)


def test_precompile_on_existing_cluster(ray_head, tmp_path):
    cache, report = tmp_path / "cache", tmp_path / "report.json"
    proc, _, out = precompile("--config", str(SMALL), "--cache", str(cache), "--address",
                              ray_head, "--json", "--report", str(report),
                              env={"RAY_AUTH_MODE": "token"})
    assert proc.returncode == 0, explain(proc)
    assert out["address"] == ray_head and out["compiled"] == 6 and out["failed"] == 0
    assert 1 <= out["workers"] <= 2
    data = json.loads(report.read_text())
    with Store(cache) as store:
        for row in data["jobs"]:
            hit = store.get_compile(row["key"])
            assert hit is not None and hit.cubin[:4] == b"\x7fELF"
    # the kernel module came through runtime_env py_modules, not from the project directory
    for info in data["worker_info"]:
        src = info["sources"]["farm_kernels.scale"]
        assert src and not src.startswith(str(PROJECT)), src
        assert info["toolchain"] == out["toolchain"]


def test_unreachable_cluster_is_a_clear_error(tmp_path):
    """Fails fast: ctbuild's own connection check answers (Ray itself would retry for
    minutes); the timeout only guards against a hang."""
    proc, _, _ = precompile("--config", str(SMALL), "--cache", str(tmp_path / "c"),
                            "--address", f"127.0.0.1:{free_port()}", timeout=120)
    assert proc.returncode == 1, explain(proc)
    assert "could not join the Ray cluster at 127.0.0.1:" in proc.stderr
    assert "nothing answers there" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
