"""Build workers on the driver's machine take its toolchain probe instead of running tileiras
and ptxas again (`toolchain.adopt`), only when they would probe the very same files."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ctbuild import toolchain
from ctbuild.toolchain import _stamps, adopt, probe, shareable

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = f"""
import json, sys
sys.path.insert(0, {str(ROOT)!r})
from ctbuild import cutile
from ctbuild.toolchain import adopt, probe
adopted = adopt(json.loads(sys.stdin.read()))
fingerprint = probe().fingerprint
print(json.dumps({{"adopted": adopted, "fingerprint": fingerprint,
                  "asked_tileiras": cutile.max_bytecode_version.cache_info().currsize}}))
"""


def _worker(shared: dict) -> dict:
    proc = subprocess.run([sys.executable, "-c", SCRIPT], input=json.dumps(shared),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def shared() -> dict:
    return json.loads(json.dumps(shareable(probe())))  # as it travels to a worker


def test_a_worker_with_the_same_files_adopts_the_probe_without_running_tileiras(shared):
    out = _worker(shared)
    assert out == {"adopted": True, "fingerprint": shared["fingerprint"], "asked_tileiras": 0}


@pytest.fixture
def fresh_process_state():
    """This process as a worker that has not probed yet (its own probe is put back after)."""
    saved = toolchain._probed
    toolchain._probed = None
    yield
    toolchain._probed = saved


@pytest.mark.parametrize("change", ["boot", "file", "path", "cuda_tile", "env"])
def test_any_difference_means_the_worker_probes_itself(shared, change, fresh_process_state):
    theirs = json.loads(json.dumps(shared))
    if change == "boot":
        theirs["stamps"]["boot"] = "another-machine"
    elif change == "file":
        theirs["stamps"]["files"]["tileiras"][4] += 1   # the file changed since
    elif change == "path":
        theirs["paths"]["ptxas"] = "/elsewhere/ptxas"
    elif change == "cuda_tile":
        theirs["stamps"]["cuda_tile"] = "0.0.1"
    else:
        theirs["stamps"]["env"] = {"CUDA_TILE_TESTING_DISABLE_DIV": "1"}
    theirs["fingerprint"] = "planted"
    assert adopt(theirs) is False and toolchain._probed is None
    assert probe().fingerprint == shared["fingerprint"]  # its own probe, not the planted one


def test_a_malformed_shared_probe_is_ignored(shared, fresh_process_state):
    for theirs in ({}, {"paths": shared["paths"]}, {**shared, "fingerprint": None,
                                                      "profile": None}, ["not", "a", "dict"]):
        assert adopt(theirs) is False and toolchain._probed is None
    assert adopt(json.loads(json.dumps(shared))) is True  # the same process takes a good one
    assert probe().fingerprint == shared["fingerprint"]


def test_rewriting_a_file_with_its_old_bytes_and_mtime_still_changes_its_stamp(tmp_path):
    f = tmp_path / "tool"
    f.write_bytes(b"v1")
    before = _stamps({"tool": str(f)})
    st = os.stat(f)
    f.write_bytes(b"v2")
    f.write_bytes(b"v1")
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))  # mtime set back; the change time moves
    assert _stamps({"tool": str(f)})["files"] != before["files"]
