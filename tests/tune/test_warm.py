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


@pytest.mark.skipif(__import__("conftest").cuda_available(),
                    reason="needs a started process that cannot make a context: no GPU visible")
def test_a_started_process_without_a_gpu_reports_none_and_still_waits_for_its_spec() -> None:
    """Its report is how the supervisor learns the GPU without a CUDA start of its own; a
    process that could not make a context reports nothing, and the supervisor asks torch."""
    warm = WarmLanes(None)
    try:
        assert warm.gpus() is None
        proc = warm.take(None)
        assert proc is not None and proc.poll() is None
        assert warm.gpus() is None  # read once
    finally:
        warm.close()


@pytest.mark.gpu
def test_a_started_process_reports_the_gpu_torch_names_here() -> None:
    """On a GPU the supervisor tunes on what the started process reports: the same device as
    `current_device` gives in this process (a report that failed would fall back to torch
    silently, and this is the one place that would show it)."""
    from ctbuild.tune.tuner import current_device
    warm = WarmLanes([0])
    try:
        reports = warm.gpus()
    finally:
        warm.close()
    here = current_device(0)
    assert reports == [{"arch": here.arch, "name": here.name, "driver": here.driver}]


@pytest.mark.parametrize(("written", "expected"), [
    (b'{"arch": "sm_90", "name": "NVIDIA H200", "driver": "580.159"}',
     {"arch": "sm_90", "name": "NVIDIA H200", "driver": "580.159"}),
    (b"", None), (b"not json", None), (b'{"arch": "sm_90", "name": "x"}', None),
    (b'{"arch": 90, "name": "x", "driver": "1"}', None), (b'[1, 2]', None),
    (b'{"arch": "sm_90", "name": "x", "driver": "1", "index": 3}', None),
    (b'{"arch": "sm_90", "name": "' + b"x" * 8192 + b'", "driver": "1"}', None),
])
def test_a_report_is_read_only_as_this_module_writes_it(written: bytes, expected: object) -> None:
    import os

    from ctbuild.tune.warm import _report
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # a writer that may exceed the pipe's buffer
        os.close(read)
        os.write(write, written)
        os._exit(0)
    os.close(write)
    assert _report(read, time.monotonic() + 30) == expected
    os.waitpid(pid, 0)


def test_a_report_never_written_is_given_up_at_the_deadline() -> None:
    import os

    from ctbuild.tune.warm import _report
    read, write = os.pipe()
    try:
        assert _report(read, time.monotonic() + 0.2) is None
    finally:
        os.close(write)


def test_the_gpu_to_tune_on_is_taken_from_the_reports_of_one_model(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A report as a started process writes it (its `current_device`, asked of torch there:
    no GPU here to ask) gives the supervisor the same device, at the lane's own index."""
    import os

    import ctbuild.tune.tuner as tuner
    from ctbuild.commands.tune import lanes_device
    from ctbuild.tune.warm import _report, gpu_report
    monkeypatch.setattr(tuner, "current_device",
                        lambda: tuner.Device(0, "sm_90", "NVIDIA H200", "580.159"))
    read, write = os.pipe()
    os.write(write, gpu_report())
    os.close(write)
    h200 = _report(read, time.monotonic() + 30)
    assert h200 is not None
    gpus, device = lanes_device(None, [h200]) or (None, None)
    assert gpus is None and device == tuner.Device(0, "sm_90", "NVIDIA H200", "580.159")
    gpus, device = lanes_device("1,0", [h200, h200]) or (None, None)
    assert gpus == [1, 0] and device is not None and device.index == 1
    b200 = {"arch": "sm_100", "name": "NVIDIA B200", "driver": "580.159"}
    assert lanes_device("0,1", [h200, b200]) is None  # torch names the mixed models
    assert lanes_device("0,1", [h200]) is None and lanes_device(None, []) is None
    assert lanes_device("0,x", [h200]) is None and lanes_device(None, None) is None


def test_lanes_not_all_started_report_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """A GPU the visible list does not hold gets no process: torch is asked at once, and names
    it (not after the others' reports)."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    warm = WarmLanes([0, 3])
    try:
        assert not warm.complete and warm.gpus() is None
        assert warm.take(lane_env(0)) is not None
    finally:
        warm.close()
