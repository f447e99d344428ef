"""A real two-node Ray cluster on this machine, no shared filesystem with the driver.

The head runs normally; the second node runs in its own mount namespace where every filesystem
is read-only except its temp directory (and /dev/shm for Ray's object store), so its workers can
write nowhere else. The driver runs in another private mount namespace with a tmpfs over its
cache's parent: no worker can see the cache. Every job must land in the driver's cache, and
``ctbuild cache verify`` must pass there.
"""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "fixtures" / "farm_project"))
from cli_helpers import ROOT, SMALL, explain, free_port, stop_session  # noqa: E402

RAY = Path(sys.executable).with_name("ray")
pytestmark = pytest.mark.slow


def _can_unshare() -> bool:
    return os.geteuid() == 0 and subprocess.run(
        ["unshare", "-m", "true"], capture_output=True).returncode == 0


#: What ``ray start`` says when a port it was given was taken meanwhile (`free_port` only
#: finds one free at that moment; another test's Ray may take it before the head binds it).
PORT_TAKEN = "Failed to start the grpc server"


def _start_node(argv: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen | None:
    """The started node; None where its port was taken meanwhile (the caller picks another)."""
    with open(log, "w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
    deadline = time.monotonic() + 120
    while "Ray runtime started" not in log.read_text():
        if proc.poll() is not None or time.monotonic() > deadline:
            stop_session(proc)
            if PORT_TAKEN in log.read_text():
                return None
            pytest.fail(f"ray start failed:\n{log.read_text()[-3000:]}")
        time.sleep(0.3)
    return proc


@pytest.fixture
def two_nodes(tmp_path_factory):
    """A head (no CPUs: it schedules no worker) and a locked-down second node (2 CPUs, where
    every worker runs); yields (address, node temp)."""
    if not RAY.exists():
        pytest.skip("ray CLI not installed next to this Python")
    if not _can_unshare():
        pytest.skip("needs root and unshare -m (private mount namespaces)")
    base = Path(os.environ.get("TMPDIR", "/tmp"))
    logs = tmp_path_factory.mktemp("raylogs")
    env = {**os.environ, "RAY_AUTH_MODE": "token"}
    env.pop("RAY_ADDRESS", None)
    head = None
    for _ in range(3):  # a port taken between free_port and the head's bind: another port
        port = free_port()
        head_temp, node_temp = base / f"rh{port}", base / f"rn{port}"  # short: socket paths
        for d in (head_temp, node_temp, node_temp / "tmp"):
            d.mkdir(exist_ok=True)
        head = _start_node(
            [str(RAY), "start", "--head", "--port", str(port), "--node-ip-address",
             "127.0.0.1", "--num-cpus", "0", "--disable-usage-stats",
             "--include-dashboard=false", "--temp-dir", str(head_temp), "--block"],
            logs / "head.log", env)
        if head is not None:
            break
        subprocess.run(["rm", "-rf", str(head_temp), str(node_temp)], check=False)
    if head is None:
        pytest.fail(f"ray start failed three times, each port taken:\n"
                    f"{(logs / 'head.log').read_text()[-3000:]}")
    address = f"127.0.0.1:{port}"
    node = None
    try:
        # Read-only everything, except this node's temp dir (a bind mount of its own).
        locked = (f"mount --make-rprivate / && mount --bind {node_temp} {node_temp} && "
                  "mount -o remount,bind,ro / && "
                  f"exec {RAY} start --address {address} --node-ip-address 127.0.0.1 "
                  f"--num-cpus 2 --disable-usage-stats --temp-dir {node_temp} --block")
        node = _start_node(["unshare", "-m", "sh", "-c", locked], logs / "node.log",
                           {**env, "TMPDIR": str(node_temp / "tmp")})
        yield address, node_temp
    finally:
        if node is not None:
            stop_session(node)
        stop_session(head)
        subprocess.run(["rm", "-rf", str(head_temp), str(node_temp)], check=False)


def test_cluster_build_lands_in_a_cache_no_worker_can_see(two_nodes, tmp_path):
    address, node_temp = two_nodes
    hidden = tmp_path / "hidden"   # a tmpfs over it in the driver's namespace only
    hidden.mkdir()
    cache = hidden / "cache"
    py = shlex.quote(sys.executable)
    script = (f"mount -t tmpfs none {hidden} && "
              f"{py} -m ctbuild precompile --config {SMALL} --cache {cache} --address {address} "
              f"--workers 2 --json --report {hidden}/report.json > {hidden}/out.json; "
              f"echo \"precompile=$?\" >&2; "
              f"{py} -m ctbuild cache verify --cache {cache} >&2; echo \"verify=$?\" >&2; "
              f"{py} -c 'import json,sys; from ctbuild.cache import Store; "
              f"r=json.load(open(\"{hidden}/report.json\")); s=Store(\"{cache}\"); "
              f"print(json.dumps({{\"out\": json.load(open(\"{hidden}/out.json\")), "
              f"\"landed\": sum(bool(s.get_compile(j[\"key\"])) for j in r[\"jobs\"]), "
              f"\"entries\": sum(1 for _ in s.compile_entries()), "
              f"\"temps\": [w[\"temp\"] for w in r[\"worker_info\"]]}}))'")
    env = {**os.environ, "RAY_AUTH_MODE": "token", "PYTHONPATH": str(ROOT)}
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=400)
    assert "precompile=0" in proc.stderr and "verify=0" in proc.stderr, explain(proc)
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    out = got["out"]
    assert out["address"] == address and out["compiled"] == 6 and out["failed"] == 0, out
    assert got["landed"] == 6 and got["entries"] == 6  # counts match the cache
    # the workers ran on the locked-down node: they could write only below its temp dir
    assert got["temps"] and all(t.startswith(str(node_temp)) for t in got["temps"]), got

    assert not (hidden / "cache").exists()  # the cache lived only in the driver's namespace
