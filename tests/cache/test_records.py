"""`ctbuild.records`: stored records read back typed, older ones (no ``format``) as format 1,
newer formats refused, and a refused tuning record in a real cache read as a miss."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from ctbuild.cache import Store
from ctbuild.records import (
    CompileMeta,
    MissRecord,
    RecordFormatError,
    TuningRecord,
    stored_tuning,
)

V1_TUNING = {  # as `ctbuild tune` wrote it before records were typed (no "format" key)
    "kernel": "matmul", "module": "demo_kernels.matmul", "kernel_fp": "fp", "arch": "sm_90",
    "gpu": "H100", "driver": "13.0", "toolchain": "tc", "tuning_key": [[256, 256]],
    "workload": {"A": {"tensor": [256, 256], "dtype": "float16"}},
    "config": {"BM": 64}, "compile_key": "ck", "mean_us": 10.0, "ci_us": 0.5,
    "default": {"config": {"BM": 128}, "mean_us": 15.0, "ci_us": 0.7},
    "candidates": [{"config": {"BM": 64}, "mean_us": 10.0, "ci_us": 0.5, "samples": 9}],
    "failures": [], "space": {"total": 4, "pruned": 1, "kept": 3},
    "compiled_during_tune": 0, "compiles_during_measurement": 0, "measure_seconds": 1.0,
    "seconds": 2.0, "source": "workload", "tuned_at": "2026-01-01T00:00:00+00:00",
    "created": 1.0,  # added by the store
}


def test_tuning_record_without_format_reads_as_v1_and_writes_the_same_fields() -> None:
    rec = TuningRecord.from_json(V1_TUNING)
    assert rec.format == 1 and rec.config == {"BM": 64} and rec.default_config == {"BM": 128}
    assert rec.speedup_vs_default == pytest.approx(1.5)
    written = rec.to_json()
    assert written["format"] == 1
    assert V1_TUNING == {k: v for k, v in written.items() if k in V1_TUNING}
    # fields a v1 record did not have are written empty (how the winner was chosen: tune's)
    added = {k: v for k, v in written.items() if k not in V1_TUNING and k != "format"}
    assert added == {"choice": None, "runoff": None, "regret": None, "refined": None, "check": None,
                     "fleet": None, "phase_seconds": {}, "by_class": None}


@pytest.mark.parametrize("bad", [{**V1_TUNING, "format": 2}, {**V1_TUNING, "format": "1"},
                                 {k: v for k, v in V1_TUNING.items() if k != "kernel"}, [1]])
def test_unreadable_tuning_records_are_refused(bad: object) -> None:
    with pytest.raises(RecordFormatError):
        TuningRecord.from_json(bad)


def test_a_newer_tuning_record_in_the_cache_is_a_miss(tmp_path: Path) -> None:
    with Store(tmp_path / "c") as store:
        store.put_tuning("new", {**V1_TUNING, "format": 99})
        store.put_tuning("old", V1_TUNING)
        assert stored_tuning(store, "new") is None
        assert stored_tuning(store, "absent") is None
        old = stored_tuning(store, "old")
        assert old is not None and old.compile_key == "ck"


def test_compile_meta_keeps_its_json_names() -> None:
    build = CompileMeta(kernel="k", module="m", kernel_fp="fp", arch="sm_90", config={"BM": 64},
                        workload={}, toolchain="tc", compile_seconds=1.5, tileir="d",
                        cls="relaxed", weaken={"cls": "relaxed"})
    stored = build.to_json()
    assert stored["class"] == "relaxed" and "cls" not in stored and stored["format"] == 1
    assert CompileMeta.from_json({**stored, "digest": "x", "size": 3}) == build
    jit = CompileMeta.from_json({"kernel": "k", "arch": "sm_90", "source": "runtime-jit"})
    assert jit.signature_class == "exact" and jit.workload is None  # written before classes
    for bad in ({"arch": "sm_90"}, {"kernel": "k", "format": 2}):
        with pytest.raises(RecordFormatError):
            CompileMeta.from_json(bad)


def test_miss_record_line_is_unchanged() -> None:
    line = json.dumps({"kernel": "k", "workload": {"x": {"scalar": "int32"}}, "arch": "sm_90"})
    miss = MissRecord.from_json(json.loads(line))
    assert json.dumps(miss.to_json()) == line
    with pytest.raises(RecordFormatError, match="expected an object"):
        MissRecord.from_json({"kernel": "k"})
    with pytest.raises(RecordFormatError, match="format 2"):
        MissRecord.from_json({**json.loads(line), "format": 2})
