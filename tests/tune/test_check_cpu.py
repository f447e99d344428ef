"""The correctness gate (`ctbuild.tune.check`) on CPU tensors: each ``launch`` is a Python
function writing into them as a config's kernel would (the GPU tests run real kernels)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from ctbuild.space import Config
from ctbuild.specs import Workload

torch = pytest.importorskip("torch")

DEFAULT, OTHER = Config({"TILE": 64}), Config({"TILE": 128})


def gate(inputs: dict, kernels: dict, check=None, reset_to_zero=()):
    """An OutputCheck over ``inputs`` whose launch runs ``kernels[cfg.TILE](w)``."""
    from ctbuild.tune.check import OutputCheck
    w = Workload(inputs)
    tuned = SimpleNamespace(check=check, reset_to_zero=tuple(reset_to_zero))
    return OutputCheck(tuned, w, lambda cfg: kernels[cfg.TILE](w)), w  # type: ignore[arg-type]


def xy(dtype=torch.float32, shape=(16, 8)):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(0)).to(dtype)
    return {"X": x, "OUT": torch.full(shape, 7.0).to(dtype)}


def test_equal_and_within_tolerance_pass():
    def twice(w):
        w.OUT.copy_(w.X * 2)

    def reordered(w):  # another summation order: a few ulps off
        w.OUT.copy_(w.X * 2 * (1 + 3e-7))
    check, _ = gate(xy(), {64: twice, 128: reordered})
    assert check.reference(DEFAULT) is None
    assert check.verdict(DEFAULT) is None and check.verdict(OTHER) is None


@pytest.mark.parametrize("dtype,ulps", [(torch.float16, 2), (torch.bfloat16, 2),
                                        (torch.float8_e4m3fn, 1)])
def test_low_precision_tolerates_a_few_ulps(dtype, ulps):
    eps = torch.finfo(dtype).eps

    def off(w):
        w.OUT.copy_((w.X.float() * (1 + ulps * eps)).to(dtype))
    check, _ = gate(xy(dtype), {64: lambda w: w.OUT.copy_(w.X), 128: off})
    assert check.reference(DEFAULT) is None and check.verdict(OTHER) is None


def test_wrong_by_a_little_names_the_element():
    def wrong(w):
        w.OUT.copy_(w.X * 2)
        w.OUT[3, 5] += 0.01 * w.OUT.abs().max()
    inputs = xy()
    check, _ = gate(inputs, {64: lambda w: w.OUT.copy_(w.X * 2), 128: wrong})
    assert check.reference(DEFAULT) is None
    verdict = check.verdict(OTHER)
    exp = float(inputs["X"][3, 5] * 2)
    assert verdict.startswith("wrong result: max abs diff ") and " at OUT[3, 5] " in verdict
    assert f"(expected {exp:.6g}, got " in verdict and "; 1 of 128 elements off)" in verdict


def test_nan_positions_must_match():
    def nan_at(w):
        w.OUT.copy_(w.X)
        w.OUT[2, 1] = float("nan")
    check, _ = gate(xy(), {64: nan_at, 128: lambda w: w.OUT.copy_(w.X), 256: nan_at})
    assert check.reference(DEFAULT) is None
    assert "max abs diff nan at OUT[2, 1] (expected nan, got " in check.verdict(OTHER)
    assert check.verdict(Config({"TILE": 256})) is None   # NaN where the reference has it


def test_integers_are_exact():
    inputs = {"X": torch.arange(32, dtype=torch.int32), "OUT": torch.zeros(32, dtype=torch.int32)}

    def off_by_one(w):
        w.OUT.copy_(w.X + 1)
        w.OUT[31] += 1
    check, _ = gate(inputs, {64: lambda w: w.OUT.copy_(w.X + 1), 128: off_by_one})
    assert check.reference(DEFAULT) is None
    assert check.verdict(OTHER) == ("wrong result: max abs diff 1 at OUT[31] (expected 32, "
                                    "got 33; 1 of 32 elements off)")


def test_every_launch_starts_from_the_same_bytes():
    """The default accumulates into half of OUT and leaves the rest as it was; a wrong config
    also scribbles on the other half. Each launch starts from the snapshot, so the scribble
    does not reach the next config, and the accumulation does not compound."""
    def half(w):
        w.OUT[:8] += w.X[:8]

    def scribble(w):
        half(w)
        w.OUT[12, 3] = -1.0
    check, w = gate(xy(), {64: half, 128: scribble})
    before = w.OUT.clone()
    assert check.reference(DEFAULT) is None
    assert check.verdict(OTHER) == ("wrong result: max abs diff 8 at OUT[12, 3] (expected 7, "
                                    "got -1; 1 of 128 elements off)")
    assert check.verdict(DEFAULT) is None and check.verdict(DEFAULT) is None
    assert torch.equal(w.OUT[8:], before[8:])


def test_a_config_that_writes_an_input_is_caught():
    def clobber(w):
        w.OUT.copy_(w.X * 2)
        w.X[0, 0] = 100.0
    check, _ = gate(xy(), {64: lambda w: w.OUT.copy_(w.X * 2), 128: clobber})
    assert check.reference(DEFAULT) is None
    assert " at X[0, 0] (expected " in check.verdict(OTHER)
    assert check.expected["X"].data_ptr() == check.snapshot["X"].data_ptr()  # no extra copy


def test_a_launch_that_raises_is_a_verdict():
    def boom(w):
        raise RuntimeError("CUDA_ERROR_ILLEGAL_ADDRESS")
    check, _ = gate(xy(), {64: lambda w: w.OUT.copy_(w.X), 128: boom})
    assert check.reference(DEFAULT) is None
    assert check.verdict(OTHER) == "check: RuntimeError: CUDA_ERROR_ILLEGAL_ADDRESS"
    assert check.verdict(DEFAULT) is None
    failing, _ = gate(xy(), {64: boom})
    assert failing.reference(DEFAULT) == ("the default config {TILE=64} cannot be the reference: "
                                          "check: RuntimeError: CUDA_ERROR_ILLEGAL_ADDRESS")
    with pytest.raises(RuntimeError, match="before a reference"):
        failing.verdict(OTHER)


def test_user_reference_checks_the_default_too():
    def ref(w):
        assert torch.equal(w.ACC, torch.zeros(4))   # reset_to_zero= as a launch sees it
        return {"OUT": w.X * 2}
    inputs = {**xy(), "ACC": torch.ones(4)}
    kernels = {64: lambda w: w.OUT.copy_(w.X * 3), 128: lambda w: w.OUT.copy_(w.X * 2)}
    check, _ = gate(inputs, kernels, check=ref, reset_to_zero=("ACC",))
    problem = check.reference(DEFAULT)
    assert problem.startswith("the default config {TILE=64} fails check=: wrong result: max abs "
                              "diff ") and "128 of 128 elements off" in problem
    assert check.verdict(OTHER) is None   # the reference is the user's, not the default's
    scratch = {64: lambda w: (w.OUT.copy_(w.X * 2), w.ACC.fill_(9.0))}
    check, _ = gate({**xy(), "ACC": torch.ones(4)}, scratch, check=lambda w: {"OUT": w.X * 2})
    assert check.reference(DEFAULT) is None   # only the named arguments are compared


@pytest.mark.parametrize("ref,expected", [
    (lambda w: {"NOPE": w.X}, "check= returned 'NOPE', which is no tensor argument; tensor "
                              "arguments: X, OUT"),
    (lambda w: {"OUT": w.X[:2]}, "check= returned 'OUT' with shape (2, 8); the argument's is "
                                 "(16, 8)"),
    (lambda w: [w.X], "check= returned list, not {argument: expected}"),
    (lambda w: 1 / 0, "check= raised ZeroDivisionError: division by zero"),
])
def test_a_bad_user_reference_is_an_error(ref, expected):
    check, _ = gate(xy(), {64: lambda w: w.OUT.copy_(w.X)}, check=ref)
    assert check.reference(DEFAULT) == expected
    with pytest.raises(RuntimeError, match="before a reference"):
        check.verdict(OTHER)   # no half-made reference to compare with


def test_large_tensors_are_compared_in_pieces(monkeypatch):
    """Pieces of whole rows, and rows split further: the element is located all the same."""
    from ctbuild.tune import check as check_module
    for chunk in (40, 3):
        monkeypatch.setattr(check_module, "CHUNK", chunk)
        inputs = {"X": torch.randn(4, 5, 6), "OUT": torch.zeros(4, 5, 6)}

        def wrong(w):
            w.OUT.copy_(w.X)
            w.OUT[2, 3, 4] = 1e3
        check, _ = gate(inputs, {64: lambda w: w.OUT.copy_(w.X), 128: wrong})
        assert check.reference(DEFAULT) is None
        assert " at OUT[2, 3, 4] " in check.verdict(OTHER)


def test_strided_and_broadcast_arguments_restore():
    base = torch.randn(8)
    inputs = {"X": base.as_strided((4, 8), (0, 1)), "OUT": torch.zeros(16)[::2]}
    def off(w):
        w.OUT.copy_(w.X[1])
        w.OUT[5] += 1
    check, w = gate(inputs, {64: lambda w: w.OUT.copy_(w.X[0]), 128: off})
    assert check.reference(DEFAULT) is None
    assert " at OUT[5] " in check.verdict(OTHER)
    assert check.verdict(DEFAULT) is None and torch.equal(w.OUT, base)
