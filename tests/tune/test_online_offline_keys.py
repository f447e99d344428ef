"""The keys online tuning (``CTBUILD_MODE=tune``) and ``ctbuild tune`` write their records
under, for the same workload, and the keys the runtime looks them up with.

Online tuning runs the ``ctbuild tune`` engine (`tune_workload`) on the caller's real arguments;
``ctbuild tune`` runs it on the declared specs. Both must record under the key the runtime
computes for the call, and measure the CUBINs ``ctbuild precompile`` built (the same compile
keys), for tensors (contiguous, and a strided view at an odd address), Python scalars of each
kind, and ``ct.Constant`` arguments (bound by name, and passed through ``args=``). The tuning
keys and the stored workloads are pinned literally: a record written by an earlier version
must still be found, so any change here is a change to review.
"""
from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

import cuda.tile as ct  # noqa: E402
from conftest import RUNTIME_TOOLCHAIN  # noqa: E402

import ctbuild  # noqa: E402
from ctbuild import Product, Scalar, Tensor, cutile, runtime  # noqa: E402
from ctbuild.arch import Arch  # noqa: E402
from ctbuild.compile.plan import job_for  # noqa: E402
from ctbuild.keys import tuning_record_key  # noqa: E402

GPU = "NVIDIA H100 80GB HBM3"
ARCH = "sm_90"


@ctbuild.autotune(space=Product(TILE=[16, 32]), grid=lambda cfg, w: (1,),
                  workloads=[{"X": Tensor((64,), "float32"),
                              "Y": Tensor((8, 31), "float16", strides=(32, 1), align=2),
                              "n": Scalar("int32", 5), "eps": Scalar("float32", 0.25),
                              "flag": Scalar("bool", True), "WIDTH": 31}])
@ct.kernel
def keys_by_name(X, Y, n, eps, flag, WIDTH: ct.Constant[int], TILE: ct.Constant[int]):
    x = ct.load(X, index=(0,), shape=(TILE,))
    ct.store(X, index=(0,), tile=x * eps)


@ctbuild.autotune(space=Product(occupancy=[1, 2]), grid=lambda cfg, w: (1,),
                  args=lambda cfg, w: (w.X, w.n, w.eps, w.scale),
                  key=lambda w: (w.X.shape[0], w.n, w.eps),  # reads the scalars' values
                  default={"occupancy": 1},
                  workloads=[{"X": Tensor((64,), "float32"), "n": 7, "eps": 0.5,
                              "scale": 2.0}])
@ct.kernel
def keys_by_args(X, n, eps, SCALE: ct.Constant[float]):
    x = ct.load(X, index=(0,), shape=(16,))
    ct.store(X, index=(0,), tile=x * SCALE)


def aligned(n: int) -> Any:
    """``n`` float32 zeros at a 256-byte aligned address (as a CUDA allocation is)."""
    buf = torch.zeros(n + 64)
    start = (-buf.data_ptr() % 256) // 4
    return buf[start:start + n]


def live_args(name: str) -> tuple:
    """The real (host) arguments of the declared workload, as a caller passes them."""
    x = aligned(64)
    if name == "keys_by_args":
        return (x, 7, 0.5, 2.0)
    y = torch.zeros(8, 32, dtype=torch.float16)[:, 1:]  # strides (32, 1), base address % 4 == 2
    return (x, y, 5, 0.25, True, 31)


#: The tuning key each kernel's records are stored under (from the call, as the runtime sees
#: it; `ctbuild tune` computes the same one from the declared specs).
TUNING_KEYS = {
    "keys_by_name": [[[[64], "float32", "C"], [[8, 31], "float16", [32, 1]], "int", "float",
                      "bool", "int"], [31]],
    "keys_by_args": [[64, 7, 0.5], [2.0]],
}
#: The workload a record stores: online (the caller's arguments as specs) and offline (the
#: declared specs).
ONLINE_WORKLOADS = {
    "keys_by_name": {"X": {"tensor": [64], "dtype": "float32", "strides": [1], "align": 256},
                     "Y": {"tensor": [8, 31], "dtype": "float16", "strides": [32, 1],
                           "align": 2},
                     "n": 5, "eps": 0.25, "flag": True, "WIDTH": 31},
    "keys_by_args": {"X": {"tensor": [64], "dtype": "float32", "strides": [1], "align": 256},
                     "n": 7, "eps": 0.5, "scale": 2.0},
}
OFFLINE_WORKLOADS = {
    "keys_by_name": {**ONLINE_WORKLOADS["keys_by_name"],
                     "n": {"scalar": "int32", "example": 5},
                     "eps": {"scalar": "float32", "example": 0.25},
                     "flag": {"scalar": "bool", "example": True}},
    "keys_by_args": ONLINE_WORKLOADS["keys_by_args"],
}


class FakeStream:
    def synchronize(self) -> None:
        pass


@pytest.fixture
def fake_measurement(monkeypatch: pytest.MonkeyPatch) -> None:
    """cuTile's search, its sampler and ``ct.launch`` replaced by a clock that prefers the
    config listed first (the keys are under test, not the timing)."""
    from cuda.tile.tune._tune import Measurement, TuningResult

    def search(space: Any, stream: Any, grid_fn: Any, kernel: Any, args_fn: Any,
               hints_fn: Any = None, **kw: Any) -> Any:
        ok = [Measurement(config=cfg, mean_us=1.0 + i, num_samples=3, error_margin_us=0.01)
              for i, cfg in enumerate(space) if (grid_fn(cfg), kernel(cfg), args_fn(cfg))]
        return TuningResult(best=ok[0], successes=ok, failures=[])

    monkeypatch.setattr(ct.tune, "exhaustive_search", search)
    monkeypatch.setattr(cutile, "benchmark_sample", lambda *a, **k: 1.0)
    monkeypatch.setattr(ct, "launch", lambda *a: None)


def primed(store: Any, tuned: Any) -> dict[Any, str]:
    """Put a CUBIN in ``store`` for every candidate, under the compile key `ctbuild precompile`
    gives it for the declared workload; return them by config."""
    w = tuned.workloads[0]
    keys = {cfg: job_for(tuned, cfg, w, ARCH, RUNTIME_TOOLCHAIN).key
            for cfg in tuned.candidates(w, Arch(ARCH)).kept}
    for key in keys.values():
        store.put_compile(key, b"\x7fELF-" + key.encode(), symbol="sym", meta={})
    return keys


@pytest.mark.parametrize("name", ["keys_by_name", "keys_by_args"])
def test_online_and_offline_tuning_record_under_the_key_the_runtime_looks_up(
        name: str, runtime_store: Any, fake_measurement: None, tmp_path: Any) -> None:
    from ctbuild.cache import Store
    from ctbuild.tune import tuner as tuning
    tuned = {"keys_by_name": keys_by_name, "keys_by_args": keys_by_args}[name]
    device = tuning.Device(0, ARCH, GPU, "580.0")
    kw = dict(toolchain_fp=RUNTIME_TOOLCHAIN, device=device, stream=FakeStream(),
              input_device="cpu", timeout_s=None)
    record_key = tuning_record_key(kernel_fp=tuned.fingerprint, tuning_key=TUNING_KEYS[name],
                                   arch=ARCH, gpu=GPU, toolchain_fp=RUNTIME_TOOLCHAIN)

    # online: the engine on the caller's arguments (what `tune_online` runs)
    built = primed(runtime_store, tuned)
    online = tuning.tune_workload(tuned, tuned.bind(*live_args(name)), store=runtime_store,
                                  **kw)
    assert online.source == "online" and not online.failures  # every precompiled CUBIN found
    assert len(online.candidates) == len(built)
    assert online.tuning_key == TUNING_KEYS[name]
    assert online.workload == ONLINE_WORKLOADS[name]
    assert online.compile_key == built[tuned.candidates(tuned.workloads[0], Arch(ARCH)).kept[0]]
    assert runtime_store.get_tuning(record_key)["config"] == online.config

    # offline: `ctbuild tune` on the declared workload, into another cache
    other = Store(tmp_path / "offline")
    assert primed(other, tuned) == built
    offline = tuning.tune_workload(tuned, tuned.workloads[0], store=other, **kw)
    assert offline.source == "workload" and not offline.failures
    assert offline.tuning_key == TUNING_KEYS[name]
    assert offline.workload == OFFLINE_WORKLOADS[name]
    assert offline.compile_key == online.compile_key
    assert other.get_tuning(record_key)["config"] == offline.config
    other.close()

    # serving: the runtime finds the online record, and the CUBIN it names, for the same call
    runtime.configure(store=runtime_store, mode="strict")
    seen = tuned.explain(*live_args(name), arch=ARCH, gpu=GPU)
    assert (seen["config_from"], seen["record_key"], seen["tuning_key"]) == \
        ("record", record_key, TUNING_KEYS[name])
    assert (seen["compile_key"], seen["cubin_class"]) == (online.compile_key, "exact")
