"""Runtime key computation on real (host) tensors agrees with the build's on specs."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import cuda.tile as ct  # noqa: E402
from gpu_runtime_examples import host_tensors, load_examples  # noqa: E402

import ctbuild  # noqa: E402
from ctbuild import Product  # noqa: E402
from ctbuild.device_table import nominal_device  # noqa: E402
from ctbuild.keys import tuning_record_key  # noqa: E402
from ctbuild.serve.live_args import align_of, spec_of, token, workload_spec  # noqa: E402
from ctbuild.signature import derive_signature, signature_text  # noqa: E402
from ctbuild.specs import Scalar, Tensor, Workload, spec_from_json, spec_to_json  # noqa: E402

KERNELS = load_examples()
CASES = [(name, i) for name, k in KERNELS.items() for i in range(len(k.workloads))]


@pytest.mark.parametrize("name,index", CASES)
def test_tuning_key_and_signature_parity(name: str, index: int) -> None:
    tuned = KERNELS[name]
    spec_w = tuned.workloads[index]
    args = host_tensors(spec_w, values=False)  # keys read layouts, not values
    real_w = tuned.bind(*args)
    # the tuning key (and so the record key) of real tensors equals the spec's
    assert tuned.tuning_key(real_w) == tuned.tuning_key(spec_w)
    def rk(w):
        return tuning_record_key(kernel_fp=tuned.fingerprint, tuning_key=tuned.tuning_key(w),
                                 arch="sm_90", gpu="NVIDIA H100 80GB HBM3", toolchain_fp="tc")
    assert rk(real_w) == rk(spec_w)
    # the spec built from the real tensors equals the declared one (alignment aside) ...
    live = workload_spec(tuned, real_w)
    for p in tuned.params:
        a, b = live[p], spec_w[p]
        if isinstance(b, Tensor):
            assert (a.shape, a.dtype, a.strides) == (b.shape, b.dtype, b.strides)
            assert a.align >= 16  # host allocations are 64-byte aligned
        elif isinstance(b, Scalar):
            assert isinstance(a, Scalar) and a.dtype == b.dtype
    # ... so the compile signature (hence the compile key) agrees for every candidate config
    for cfg in tuned.candidates(spec_w, __import__("ctbuild").Arch("sm_90")).kept[:4]:
        s_live = derive_signature(tuned.kernel, tuned.kernel_args(cfg, live))
        s_spec = derive_signature(tuned.kernel, tuned.kernel_args(cfg, spec_w))
        assert signature_text(s_live) == signature_text(s_spec)
        dev = nominal_device("sm_90")  # a grid(cfg, w, dev) needs one; the others ignore it
        assert tuned.grid(cfg, real_w, dev) == tuned.grid(cfg, spec_w, dev)


def test_record_json_round_trip() -> None:
    t = torch.zeros(8, 32, dtype=torch.float16)[:, 1:]
    spec = spec_of(t)
    assert spec.shape == (8, 31) and spec.strides == (32, 1) and spec.align == 2
    back = spec_from_json(spec_to_json(spec))
    assert back == spec
    assert spec_to_json(spec_of(1e-6)) == {"scalar": "float32", "example": 1e-6}
    assert spec_of(3) == Scalar("int32", 3)


def test_align_of() -> None:
    assert align_of(0) == 256
    assert align_of(4096) == 256
    assert align_of(256 + 64) == 64
    assert align_of(2) == 2 and align_of(3) == 1


@ctbuild.autotune(space=Product(occupancy=[1]), grid=lambda cfg, w: (1,),
                  default={"occupancy": 1})
@ct.kernel
def scaled(X, OUT, factor, TILE: ct.Constant[int]):
    x = ct.load(X, index=(0,), shape=(TILE,))
    ct.store(OUT, index=(0,), tile=x * factor)


def test_constant_args_keep_their_value_in_records() -> None:
    """A caller-passed ``ct.Constant`` argument keeps its value in the spec (it is part of the
    compile key); a plain scalar argument becomes a `Scalar` of its type."""
    w = Workload({"X": torch.zeros(16), "OUT": torch.zeros(16), "factor": 3, "TILE": 16})
    spec = workload_spec(scaled, w)
    assert spec["TILE"] == 16 and spec_to_json(spec["TILE"]) == 16
    assert spec["factor"] == Scalar("int32", 3)


def test_tokens_distinguish_what_the_key_and_signature_see() -> None:
    base = torch.zeros(64, 64, dtype=torch.float16)
    same = torch.ones(64, 64, dtype=torch.float16)
    assert token(base) == token(same)  # data and identity do not matter
    assert token(base) != token(base.float())
    assert token(base) != token(base.t())
    assert token(base) != token(torch.zeros(64, 32, dtype=torch.float16))
    offset = base.view(-1)[1:].view(63, 65)[:, :64]  # base pointer off by 2 bytes
    assert token(offset) != token(base[:63])
    assert token(1) != token(1.0) != token(True)
    assert token((1, 2)) != token([1, 2])
    with pytest.raises(TypeError):
        token(object())


def test_kernels_whose_arguments_are_of_one_kind_share_a_key_function(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A key function is compiled once per argument kinds and level (~0.1 ms of each kernel's
    first call otherwise); other kinds or levels get their own, and each keys its calls. The
    functions kept are bounded: past the bound they start over."""
    from ctbuild.serve import live_args
    monkeypatch.setattr(live_args, "_KEY_FNS", {})
    three = tuple(torch.zeros(4, 8) for _ in range(3))
    other = tuple(torch.zeros(2, 2, 2) for _ in range(3))
    key = live_args.make_key_fn(three, with_device=False, level="contiguity")
    assert live_args.make_key_fn(other, with_device=False, level="contiguity") is key
    assert key(*three) != key(*other)
    assert live_args.make_key_fn(three, with_device=False, level="layout") is not key
    assert live_args.make_key_fn(three + (1.0,), with_device=False, level="contiguity") \
        is not key
    live_args._KEY_FNS.update((str(i), None) for i in range(live_args._MAX_KEY_FNS))
    aligned = live_args.make_key_fn(three, with_device=False, level="alignment")
    assert len(live_args._KEY_FNS) == 1 and aligned(*three) != key(*three)
