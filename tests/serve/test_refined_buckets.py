"""Refined `Dim` buckets on a CPU: the split points a bucket's tuning record holds are read
defensively, and a size inside a sub-bucket resolves (and explains) with the sub-bucket's
record; sizes elsewhere, and caches without a map, resolve as the declaration says."""
from __future__ import annotations

import logging

import cuda.tile as ct
import pytest
from conftest import RUNTIME_TOOLCHAIN

import ctbuild
from ctbuild import Dim, Product, Tensor, runtime
from ctbuild.bucket_map import MAX_POINTS, BucketMapError, Split, read_splits, split_for
from ctbuild.cache import Store
from ctbuild.keys import record_key_for

GPU = "NVIDIA H100 80GB HBM3"


@ctbuild.autotune(space=Product(TILE=[16, 32, 64]),
                  grid=lambda cfg, w: (ct.cdiv(w.X.shape[0], cfg.TILE),),
                  default={"TILE": 64},
                  workloads=[{"X": Tensor((Dim("L", 1, 256),), "float32"),
                              "OUT": Tensor((Dim("L", 1, 256),), "float32")}])
@ct.kernel
def refined_copy(X, OUT, TILE: ct.Constant[int]):
    """OUT = X."""
    bid = ct.bid(0)
    ct.store(OUT, index=(bid,), tile=ct.load(X, index=(bid,), shape=(TILE,)))


def _bucket(top: int):
    return next(b for b in refined_copy.buckets.values() if dict(b.sizes) == {"L": top})


def _entry(*points: int) -> dict:
    return {"format": 1, "max_splits": 2,
            "splits": [{"sizes": {"L": p}, "regret_pct": 7.5} for p in points]}


def test_split_points_are_read_defensively() -> None:
    b = _bucket(256)  # sizes 129..256
    assert read_splits(None, b) == ()
    splits = read_splits(_entry(150, 200), b)
    assert [s.sizes for s in splits] == [{"L": 150}, {"L": 200}]
    assert split_for(splits, {"L": 129}) == splits[0] and split_for(splits, {"L": 150}) == \
        splits[0]
    assert split_for(splits, {"L": 151}) == splits[1] and split_for(splits, {"L": 201}) is None
    assert Split((("L", 150),)).sub_bucket(b).representative.X.shape == (150,)
    hostile = {
        "expected an object": ["L"],
        "format 2": {"format": 2, "splits": []},
        "format True": {"format": True, "splits": []},
        "no list of splits": {"splits": {"L": 150}},
        f"more than the {MAX_POINTS}": _entry(*range(130, 131 + MAX_POINTS)),
        "exactly ['L']": {"splits": [{"sizes": {"M": 150}}]},
        "L=128 is not a size in [129, 256]": _entry(128),
        "is the bucket's upper bound": _entry(256),
        "L=True": {"splits": [{"sizes": {"L": True}}]},
        "L=150.0": {"splits": [{"sizes": {"L": 150.0}}]},
        "inside the earlier split": _entry(200, 150),
        "inside the earlier split {.L.: 150}": _entry(150, 150),
    }
    for reason, raw in hostile.items():
        with pytest.raises(BucketMapError, match=reason.replace("[", r"\[").replace("]", r"\]")):
            read_splits(raw, b)
    # A regret that is not a number is not shown, the split still serves.
    assert read_splits({"splits": [{"sizes": {"L": 150}, "regret_pct": "x"}]}, b)[0] == \
        Split((("L", 150),), None)


def test_a_bucket_over_two_dims_splits_along_one() -> None:
    """A split along S (B at its upper bound) holds every B with S up to the point; the
    sub-bucket keeps the bucket's lower bound in B."""
    from ctbuild.dims import buckets
    from ctbuild.specs import Workload
    w = Workload({"X": Tensor((Dim("B", 1, 8, buckets=[8]), Dim("S", 16, 8192, buckets=[8192]),
                               64), "float16")})
    [b] = list(buckets(w))
    splits = read_splits({"splits": [{"sizes": {"B": 8, "S": 91}},
                                     {"sizes": {"B": 8, "S": 1024}}]}, b)
    assert split_for(splits, {"B": 3, "S": 91}) == splits[0]
    assert split_for(splits, {"B": 8, "S": 92}) == splits[1]
    assert split_for(splits, {"B": 1, "S": 1025}) is None
    assert splits[1].sub_bucket(b, splits[:1]).lower_bounds() == {"B": 1, "S": 92}
    # split along B, then the part B=2..8 along S: B=1 goes to the first at any S
    nested = read_splits({"splits": [{"sizes": {"B": 1, "S": 8192}},
                                     {"sizes": {"B": 8, "S": 91}}]}, b)
    assert split_for(nested, {"B": 1, "S": 50}) == nested[0]
    assert split_for(nested, {"B": 2, "S": 50}) == nested[1]
    assert split_for(nested, {"B": 2, "S": 92}) is None
    assert nested[1].sub_bucket(b, nested[:1]).lower_bounds() == {"B": 2, "S": 16}
    with pytest.raises(BucketMapError, match="upper bound"):
        read_splits({"splits": [{"sizes": {"B": 8, "S": 8192}}]}, b)


def _record(store: Store, top: int, tile: int, refined: dict | None = None) -> str:
    """A hand-written tuning record of ``refined_copy`` at size ``top`` (TILE ``tile``)."""
    w = {"X": Tensor((top,), "float32"), "OUT": Tensor((top,), "float32")}
    tk = refined_copy.tuning_key(refined_copy.bind(*w.values()))
    key = record_key_for(refined_copy, tk, "sm_90", GPU, RUNTIME_TOOLCHAIN)
    store.put_tuning(key, {"kernel": "refined_copy", "arch": "sm_90", "compile_key": "c" * 32,
                           "config": {"TILE": tile}, "refined": refined})
    return key


def _explain(n: int) -> dict:
    t = Tensor((n,), "float32")
    return refined_copy.explain(t, t, arch="sm_90", gpu=GPU)


def test_a_size_in_a_sub_bucket_resolves_with_its_record(runtime_store: Store,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    runtime.configure(store=runtime_store, mode="default")
    parent = _record(runtime_store, 256, 16, _entry(150, 200))
    sub = _record(runtime_store, 150, 32)
    inside, top, above, other = _explain(140), _explain(150), _explain(230), _explain(100)
    assert (inside["config"], inside["record_key"], inside["sub_bucket"]) == \
        ({"TILE": 32}, sub, {"L": 150})
    assert inside["bucket"] == {"L": 256} and inside["config_from"] == "record"
    assert inside["bucket_why"] == ("L=140 falls in sub-bucket L<=150, which ctbuild tune "
                                    "split from bucket L<=256; the bucket's winner was "
                                    "7.5% slower there: the sub-bucket's record serves")
    assert (top["config"], top["record_key"]) == ({"TILE": 32}, sub)  # tuned at that size
    assert (above["config"], above["record_key"], above["sub_bucket"]) == \
        ({"TILE": 16}, parent, None)
    assert above["bucket_why"].startswith("L=230 is above every sub-bucket")
    # The second split has no record (not tuned): the declared bucket's record serves it.
    mid = _explain(180)
    assert (mid["sub_bucket"], mid["config"], mid["record_key"]) == ({"L": 200}, {"TILE": 16},
                                                                     parent)
    # Another bucket (no map) resolves as the declaration says.
    assert other["bucket"] == {"L": 128} and other["sub_bucket"] is None
    assert "bucket_why" not in other and other["config_from"] == "default"
    # The runtime's resolve agrees with explain and remembers the map (one read per bucket).
    t = Tensor((140,), "float32")
    res = refined_copy.runtime.resolve((t, t), arch="sm_90", gpu=GPU)
    assert (res.sub_bucket, res.record_key, res.config.to_json()) == ({"L": 150}, sub,
                                                                      {"TILE": 32})
    assert len(refined_copy.runtime.resolver._maps) == 2
    assert not [r for r in caplog.records if "refined buckets" in r.getMessage()]


def test_a_hostile_map_is_ignored_with_a_warning(runtime_store: Store,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    runtime.configure(store=runtime_store, mode="default")
    parent = _record(runtime_store, 256, 16, {"splits": [{"sizes": {"L": 10**30}}] * 3})
    _record(runtime_store, 150, 32)
    with caplog.at_level(logging.WARNING, logger="ctbuild.runtime"):
        e = _explain(140)
    assert (e["config"], e["record_key"], e["sub_bucket"]) == ({"TILE": 16}, parent, None)
    assert "bucket_why" not in e
    warned = [r.getMessage() for r in caplog.records if "refined buckets" in r.getMessage()]
    assert len(warned) == 1 and "the declared bucket serves" in warned[0]
    assert "is not a size in [129, 256]" in warned[0]


def test_new_sizes_of_a_bucket_share_its_lookups(runtime_store: Store,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Each new size of a bucket resolves with the bucket's winner, unless its own size was
    tuned; the cache is asked once per size for a record of its own, and a signature is
    derived once per signature class, not per size (a serving loop meets every size once)."""
    import ctbuild.serve.resolve as resolve_mod
    runtime.configure(store=runtime_store, mode="default")
    parent, own = _record(runtime_store, 256, 16), _record(runtime_store, 200, 32)
    asked, derived = [], []
    get_tuning, derive = runtime_store.get_tuning, resolve_mod.derive_signature
    monkeypatch.setattr(runtime_store, "get_tuning", lambda k: (asked.append(k), get_tuning(k))[1])
    monkeypatch.setattr(resolve_mod, "derive_signature",
                        lambda *a, **k: (derived.append(1), derive(*a, **k))[1])
    sizes = range(129, 257)
    for _ in range(2):
        for n in sizes:
            t = Tensor((n,), "float32")
            res = refined_copy.runtime.resolve((t, t), arch="sm_90", gpu=GPU)
            assert (res.record_key, res.config.to_json()) == \
                ((own, {"TILE": 32}) if n == 200 else (parent, {"TILE": 16}))
            assert res.signature is not None
    # once per size for a record of its own, once for the bucket's (on the first pass only)
    assert len(asked) == len(sizes) + 1 and len(set(asked)) == len(sizes)
    # Sizes divisible by 16 or not, for the bucket's winner (TILE 16) and the default it
    # falls back to in this cache without CUBINs (TILE 64); L=200 (TILE 32) is not divisible.
    assert len(derived) == 5
