"""Measuring processes started before the plan (`ctbuild.tune.warm`): real processes, handed a
spec, stopped unused, and gone with a supervisor that died."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from ctbuild.tune.warm import WarmLanes, expected_gpus, lane_env

FIXTURE = Path(__file__).parents[1] / "fixtures" / "tune_project"


def test_the_lanes_expected_from_gpus_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5,7")
    assert expected_gpus(None) is None and expected_gpus("all") == [0, 1, 2]
    assert expected_gpus("1, 0") == [1, 0] and expected_gpus("0,x") == []
    assert lane_env(1) == {"CUDA_VISIBLE_DEVICES": "5"} and lane_env(3) is None
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # every GPU hidden: none is shown
    assert expected_gpus("all") == [] and lane_env(0) is None
    assert WarmLanes([0, 1]).take({"CUDA_VISIBLE_DEVICES": "0"}) is None  # none started
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert lane_env(1) == {"CUDA_VISIBLE_DEVICES": "1"} and lane_env(-1) is None


def test_a_lane_takes_the_process_started_for_its_gpu_and_the_rest_are_stopped() -> None:
    warm = WarmLanes([0, 1])
    try:
        assert warm.take({"CUDA_VISIBLE_DEVICES": "7"}) is None
        mine = warm.take(lane_env(1))
        assert mine is not None and mine.poll() is None
        assert warm.take(lane_env(1)) is None  # taken once
        mine.stdin.close()  # no spec: it exits, measuring nothing
        assert mine.wait(timeout=120) == 0
    finally:
        warm.close()
    assert warm.take(lane_env(0)) is None


@pytest.mark.skipif(__import__("conftest").cuda_available(),
                    reason="needs a measuring process that dies: no GPU visible")
def test_a_supervised_lane_runs_its_spec_in_the_process_started_for_it(tmp_path: Path) -> None:
    """The first child of a lane is the started process: here it dies (no GPU) with no
    candidate to blame, and the entry is reported so."""
    from ctbuild.project import load_project
    from ctbuild.tune.session import TuneOptions, entries_for
    from ctbuild.tune.supervisor import run_isolated
    entries = entries_for(load_project(FIXTURE / "ctbuild.toml").kernels())[:1]
    warm = WarmLanes(None)
    proc = warm.take(None)
    assert proc is not None
    out = run_isolated(str(FIXTURE / "ctbuild.toml"), str(tmp_path), entries,
                       TuneOptions(timeout_s=None), warm=proc, max_restarts=0)
    assert proc.returncode not in (None, 0)  # it ran the spec, and died on it
    assert [s["status"] for s in out] == ["failed"] and "died" in out[0]["note"]


SUPERVISOR = r'''
import os, sys
from ctbuild.tune.warm import WarmLanes
warm = WarmLanes([0])
print(warm.take({"CUDA_VISIBLE_DEVICES": "0"}).pid, flush=True)
os._exit(9)  # killed before it handed a spec or stopped the process
'''


def test_a_started_process_leaves_with_its_supervisor(tmp_path: Path) -> None:
    """The supervisor's stderr is a file: a pipe would be held open by the process it started,
    and the run would return only once it is gone."""
    with open(tmp_path / "stderr", "w") as err:
        sup = subprocess.run([sys.executable, "-c", SUPERVISOR], stdout=subprocess.PIPE,
                             stderr=err, text=True, timeout=120)
    assert sup.returncode == 9, (tmp_path / "stderr").read_text()
    pid = int(sup.stdout)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.05)
    assert not _alive(pid)


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie left to init counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_nothing_is_started_without_an_nvidia_driver(monkeypatch: pytest.MonkeyPatch,
                                                     tmp_path: Path) -> None:
    import ctbuild.tune.warm as warm
    monkeypatch.setattr(warm, "DRIVER_GPUS", tmp_path / "no-driver" / "gpus")
    assert warm.WarmLanes.for_gpus("0,1") is None and warm.WarmLanes.for_gpus(None) is None
