"""One rule for sizes beyond a `Dim`'s range (`ctbuild.range_rule`): `explain` and the runtime
answer alike for calls that are beyond range and also strided, of another static size, or
declared by a static workload. The runtime is a real call of torch tensors on a CPU (the stub
GPU), strict mode; every planned CUBIN is in the cache, so only the rule decides."""
from __future__ import annotations

import cuda.tile as ct
import pytest
from conftest import RUNTIME_TOOLCHAIN

import ctbuild
from ctbuild import Dim, Product, Tensor

T = Dim("T", 1, 64)


@ctbuild.autotune(
    space=Product(TILE=[16]),
    grid=lambda cfg, w: (ct.cdiv(w.X.shape[0], cfg.TILE),),
    workloads=[{"X": Tensor((T, 8), "float32"), "OUT": Tensor((T, 8), "float32")},
               {"X": Tensor((128, 8), "float32"), "OUT": Tensor((128, 8), "float32")}])
@ct.kernel
def pool_rows(X, OUT, TILE: ct.Constant[int]):
    tile = ct.load(X, index=(ct.bid(0), 0), shape=(TILE, 8), padding_mode=ct.PaddingMode.ZERO)
    ct.store(OUT, index=(ct.bid(0), 0), tile=tile)


#: (rows, columns, X a strided view?) -> beyond range? T bounds the rows up to 64, and the
#: static workload declares 128; the columns (the "pool") no Dim bounds.
CALLS = {
    (32, 8, False): False, (32, 16, False): False, (32, 8, True): False,
    (100, 8, False): True,
    (100, 16, False): True,   # was served: another pool size sent it to the generic CUBIN
    (100, 8, True): True,     # was served: so did a strided view
    (100, 16, True): True,    # was served
    (128, 8, False): False,   # was a range miss, though a static workload declares it
    (128, 8, True): False, (128, 16, False): False,
}


def test_explain_and_the_runtime_apply_one_rule(stub_gpu: list[tuple], runtime_store,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    from ctbuild import runtime
    from ctbuild.arch import Arch
    from ctbuild.compile.plan import make_plan
    from ctbuild.serve.miss_policy import CacheMissError
    for job in make_plan([pool_rows], [Arch("sm_90")], RUNTIME_TOOLCHAIN).jobs.values():
        runtime_store.put_compile(job.key, b"fake cubin", symbol=job.symbol,
                                  meta={"kernel": "pool_rows"})
    ctx = runtime.configure(store=runtime_store, mode="strict")
    monkeypatch.setattr(ctx, "device_info", lambda d: ("sm_90", "NVIDIA H100 80GB HBM3"))
    found = {}
    for (rows, cols, strided), beyond in CALLS.items():
        x = torch.zeros(rows, 2 * cols)[:, ::2] if strided else torch.zeros(rows, cols)
        out = torch.zeros(rows, cols)
        e = pool_rows.explain(x, out, arch="sm_90")
        ranges = [why for why in e.get("why", []) if "range" in why]
        try:
            pool_rows(x, out)
            refused = None
        except CacheMissError as exc:
            refused = exc
        found[rows, cols, strided] = refused is not None
        if beyond:
            assert e["cubin_class"] == "miss" and ranges, e
            assert refused is not None and refused.what == "range", refused
            assert all(why in str(refused) for why in ranges), (ranges, str(refused))
        else:
            assert e["cubin_class"] != "miss" and not ranges, e
    assert found == CALLS
    assert len(stub_gpu) == sum(not b for b in CALLS.values())  # the served ones launched
