"""Search spaces: products, zipped axes, explicit lists, constraints, the cap, hints, keys."""
from __future__ import annotations

import cuda.tile as ct
import pytest

import ctbuild
from ctbuild import Arch, Config, Configs, Product, Tensor, Workload, Zip
from ctbuild.declare import DeclarationError
from ctbuild.space import as_space, cap_configs

W = Workload({"X": Tensor((4096, 256), "float16")})


def test_product_with_zip_groups() -> None:
    space = Product(Zip(TM=[64, 128], TN=[32, 256]), TK=[16, 32])
    assert space.enumerate() == [
        {"TM": 64, "TN": 32, "TK": 16}, {"TM": 64, "TN": 32, "TK": 32},
        {"TM": 128, "TN": 256, "TK": 16}, {"TM": 128, "TN": 256, "TK": 32}]


def test_zip_lengths_must_match() -> None:
    with pytest.raises(ValueError, match="equal lengths"):
        Zip(TM=[64, 128], TN=[32])


def test_axis_twice_is_an_error() -> None:
    with pytest.raises(ValueError, match="appears twice"):
        Product(Zip(TM=[64]), TM=[128])


def test_dict_space_refuses_an_axis_named_where() -> None:
    with pytest.raises(ValueError, match="'where'"):
        as_space({"TM": [64], "where": [1, 2]})
    assert as_space({"TM": [64, 128]}).axes() == ("TM",)


def test_config_attribute_and_item_access() -> None:
    cfg = Config({"TM": 64}, "k")
    assert cfg.TM == cfg["TM"] == 64
    with pytest.raises(AttributeError, match="no axis 'TN'"):
        _ = cfg.TN
    assert Config({"a": 1}) == {"a": 1} and hash(Config({"a": 1})) == hash(Config({"a": 1}))


def test_a_config_copies_and_pickles_as_its_values() -> None:
    """copy, deepcopy and pickle go through the values: building the object first set its
    read-only slots (deepcopy raised) or looked an unset slot up as an axis (RecursionError)."""
    import copy
    import pickle
    cfg = Config({"TM": 64, "TN": [1, 2]}, owner="k")
    for twin in (copy.copy(cfg), copy.deepcopy(cfg), pickle.loads(pickle.dumps(cfg))):
        assert twin == cfg and hash(twin) == hash(cfg) and twin.TM == 64
        assert dict(twin) == {"TM": 64, "TN": [1, 2]}
    assert copy.deepcopy({cfg: [cfg]}) == {cfg: [cfg]}


@pytest.mark.parametrize("n,cap", [(100, 30), (31, 30), (10, 3), (50, 1)])
def test_cap_is_deterministic_and_keeps_default(n: int, cap: int) -> None:
    configs = [Config({"i": i}) for i in range(n)]
    default = configs[n // 2 + 1]
    kept = cap_configs(configs, default, cap)
    assert len(kept) == min(cap, n)
    assert default in kept
    assert kept == cap_configs(list(configs), default, cap)
    assert kept == sorted(kept, key=lambda c: c.i)  # enumeration order preserved
    if cap >= 3:
        assert kept[0].i < n // 4 and kept[-1].i > n // 2  # spread over the space, not first-N


def _declare(**kw):
    @ctbuild.autotune(**{"grid": lambda cfg, w: (1,), "name": f"t{id(kw)}", **kw})
    @ct.kernel
    def k(X, TILE: ct.Constant[int]):
        ct.store(X, index=(0, 0), tile=ct.load(X, index=(0, 0), shape=(TILE, TILE)))
    return k


def test_constraint_sees_config_workload_and_arch() -> None:
    seen = []

    def where(cfg, w, arch):
        seen.append((cfg.TILE, w.X.shape, arch.cc))
        return cfg.TILE <= 64 or arch.cc >= 100

    k = _declare(space=Product(TILE=[32, 64, 128], where=where), default={"TILE": 32},
                 workloads=[{"X": Tensor((64, 64), "float16")}])
    w = k.workloads[0]
    assert [c.TILE for c in k.candidates(w, Arch("sm_90")).kept] == [32, 64]
    assert [c.TILE for c in k.candidates(w, Arch("sm_100")).kept] == [32, 64, 128]
    assert (128, (64, 64), 100) in seen


def test_explicit_configs_and_hint_axes() -> None:
    k = _declare(space=Configs([{"TILE": 32, "occupancy": 2}, {"TILE": 64, "num_ctas": 2}]),
                 workloads=[{"X": Tensor((64, 64), "float16")}])
    assert k.hints(Config({"TILE": 32, "occupancy": 2})) == {"occupancy": 2}
    resolved = k.resolved_hints(Config({"TILE": 64, "num_ctas": 2}), "sm_100")
    assert resolved["num_ctas"] == 2 and resolved["opt_level"] == 3


def test_default_may_be_a_heuristic_of_the_workload() -> None:
    k = _declare(space=Product(TILE=[16, 32, 64]),
                 default=lambda w: {"TILE": 64 if w.X.shape[0] >= 64 else 16},
                 workloads=[{"X": Tensor((64, 64), "float16")}, {"X": Tensor((8, 8), "float16")}])
    assert [k.default_config(w).TILE for w in k.workloads] == [64, 16]


def test_static_default_outside_space_fails_at_declaration() -> None:
    with pytest.raises(DeclarationError, match="default TILE=48 is not one of that axis.s values"):
        _declare(space=Product(TILE=[16, 32]), default={"TILE": 48})


def test_kernel_parameter_neither_arg_nor_axis() -> None:
    with pytest.raises(DeclarationError, match=r"\['TILE'\] are neither call arguments"):
        _declare(space=Product(OTHER=[1]), params=["X"])


def test_tuning_key_shapes_dtypes_strides_and_pow2_bucket() -> None:
    key = ctbuild.key(bucket={"X": {0: ctbuild.pow2}})
    a = key(Workload({"X": Tensor((3000, 256), "float16")}))
    b = key(Workload({"X": Tensor((4096, 256), "float16")}))
    c = key(Workload({"X": Tensor((4096, 256), "float16", strides=(1, 4096))}))
    assert a == b and b != c
    assert ctbuild.pow2(1) == 1 and ctbuild.pow2(4097) == 8192


def test_tuning_key_same_for_spec_and_tensor() -> None:
    torch = pytest.importorskip("torch")
    key = ctbuild.key()
    real = Workload({"X": torch.empty((64, 32), dtype=torch.bfloat16).t()})
    spec = Workload({"X": Tensor((32, 64), "bfloat16", strides=(1, 32))})
    assert key(real) == key(spec)


def test_constant_call_arguments_join_the_tuning_key() -> None:
    @ctbuild.autotune(space=Product(TILE=[16]), grid=lambda cfg, w: (1,), name="constkey",
                      workloads=[{"X": Tensor((64,), "float16"), "MODE": 1}])
    @ct.kernel
    def k(X, MODE: ct.Constant[int], TILE: ct.Constant[int]):
        ct.store(X, index=(0,), tile=ct.load(X, index=(0,), shape=(TILE,)))
    w1 = Workload({"X": Tensor((64,), "float16"), "MODE": 1})
    w2 = Workload({"X": Tensor((64,), "float16"), "MODE": 2})
    assert k.tuning_key(w1) != k.tuning_key(w2)


def test_arch_validation() -> None:
    assert Arch("SM_90").cc == 90 and Arch("sm_100").major == 10
    with pytest.raises(ValueError, match="unknown GPU arch"):
        Arch("sm_75")


def test_a_workload_pickled_in_one_process_is_found_in_another() -> None:
    """A workload's hash is kept once made (it keys the runtime's memos on every new size);
    it is not pickled: text hashes differ between processes (here: another hash seed)."""
    import os
    import pickle
    import subprocess
    import sys
    w = Workload({"A": Tensor((ctbuild.Dim("M", 1, 64), 8), "float16"), "n": 3})
    hash(w)
    code = ("import pickle, sys; from ctbuild import Dim, Tensor, Workload; "
            "w = pickle.loads(sys.stdin.buffer.read()); "
            "fresh = Workload({'A': Tensor((Dim('M', 1, 64), 8), 'float16'), 'n': 3}); "
            "print(w == fresh, fresh in {w}, w in {fresh}, w.A.shape[1])")
    out = subprocess.run([sys.executable, "-c", code], input=pickle.dumps(w),
                         capture_output=True, check=True,
                         env={**os.environ, "PYTHONHASHSEED": "12345"}).stdout.decode()
    assert out.split() == ["True", "True", "True", "8"]
