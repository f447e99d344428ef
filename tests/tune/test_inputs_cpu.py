"""``inputs=`` and ``check=`` of ``@ctbuild.autotune``: the values tuning makes (on CPU
tensors), the declaration's errors, and ``ctbuild plan``'s note and exit 2."""
from __future__ import annotations

import itertools
from pathlib import Path

import cuda.tile as ct
import pytest

import ctbuild
from ctbuild import DeclarationError, Scalar, Tensor
from ctbuild.cli import main

torch = pytest.importorskip("torch")
_names = itertools.count()

WORKLOAD = {"X": Tensor((64, 32), "float16"), "LENS": Tensor((8,), "int32"),
            "STEP": Scalar("float32"), "OUT": Tensor((64, 32), "float16")}


def declare(workload=None, **kw):
    @ctbuild.autotune(space={"TILE": [16]}, grid=lambda cfg, w: (1,), name=f"inp{next(_names)}",
                      workloads=[workload or WORKLOAD], **kw)
    @ct.kernel
    def k(X, LENS, STEP, OUT, TILE: ct.Constant[int]):
        pass
    return k


def make(kernel, spec=None):
    from ctbuild.tune.inputs import make_inputs
    return make_inputs(kernel, spec or kernel.workloads[0], "cpu")


def test_ranges_are_honoured():
    w = make(declare(inputs={"LENS": (1, 3), "STEP": (0.5, 0.75), "X": (-2, 2.5)}))
    assert w.LENS.dtype == torch.int32 and set(w.LENS.tolist()) <= {1, 2, 3}
    assert 0.5 <= w.STEP < 0.75
    assert w.X.dtype == torch.float16 and -2 <= float(w.X.min()) and float(w.X.max()) <= 2.5
    wide = make(declare({**WORKLOAD, "LENS": Tensor((4096,), "int32")}, inputs={"LENS": (1, 3)}))
    assert set(wide.LENS.tolist()) == {1, 2, 3}   # both ends included


def test_integers_without_inputs_index_in_bounds_and_never_vanish():
    """LENS (8,) beside X and OUT (64, 32): 1..31, the smallest other extent minus one."""
    lens = make(declare({**WORKLOAD, "LENS": Tensor((4096,), "int32")})).LENS
    assert int(lens.min()) == 1 and int(lens.max()) == 31
    alone = make(declare({"X": Tensor((1,), "float16"), "LENS": Tensor((5, 100), "int64"),
                          "STEP": 1.0, "OUT": Tensor((1,), "float16")})).LENS
    assert int(alone.min()) == 1 and int(alone.max()) == 99   # no other extent: its own


def test_functions_build_arguments_in_the_declared_layout():
    strided = {**WORKLOAD, "X": Tensor((64, 32), "float16", strides=(1, 64))}

    def lens(w, device):
        return torch.arange(w.LENS.shape[0], device=device) + 100

    def both(w, device):
        return {"X": torch.ones(64, 32), "STEP": 0.25}
    w = make(declare(strided, inputs={"LENS": lens}))
    assert w.LENS.tolist() == list(range(100, 108)) and w.LENS.dtype == torch.int32
    w = make(declare(strided, inputs=both))
    assert w.X.stride() == (1, 64) and bool((w.X == 1).all()) and w.STEP == 0.25
    assert int(w.LENS.min()) >= 1   # what the function leaves out follows the rules


@pytest.mark.parametrize("inputs,message", [
    (lambda w, d: {"LENZ": 1}, "inputs= returned unknown argument(s) ['LENZ']"),
    (lambda w, d: [1], "inputs= returned list, not a mapping of argument name -> value"),
    ({"X": lambda w, d: torch.ones(3)}, "inputs= built 'X' with shape (3,); the workload "
                                        "declares (64, 32)"),
])
def test_what_a_function_builds_is_checked(inputs, message):
    k = declare(inputs=inputs)
    with pytest.raises(DeclarationError, match=rf"kernel '{k.name}' .*{_escape(message)}"):
        make(k)


def _escape(text: str) -> str:
    import re
    return re.escape(text)


BAD = [
    ({"inputs": {"LENZ": (1, 4)}}, "inputs= names unknown argument 'LENZ' (did you mean "
                                   "'LENS'?); arguments: X, LENS, STEP, OUT"),
    ({"inputs": {"LENS": (5, 1)}}, "inputs['LENS'] = (5, 1): lo is above hi"),
    ({"inputs": {"LENS": (1, 2, 3)}}, "inputs['LENS'] must be a (lo, hi) pair of finite numbers"),
    ({"inputs": {"LENS": (1, float("nan"))}}, "inputs['LENS'] must be a (lo, hi) pair"),
    ({"inputs": {"LENS": (True, 4)}}, "inputs['LENS'] must be a (lo, hi) pair"),
    ({"inputs": {"LENS": "1-4"}}, "inputs['LENS'] must be a (lo, hi) pair"),
    ({"inputs": {"LENS": (0.5, 4)}}, "inputs['LENS'] = (0.5, 4): LENS is int32; give int bounds"),
    ({"inputs": {"LENS": (1, 2**40)}}, "inputs['LENS'] = (1, 1099511627776) is outside "
                                      "int32's -2147483648..2147483647"),
    ({"inputs": 3}, "inputs= must be a mapping of argument name -> (lo, hi) range or function "
                    "(w, device), or one function (w, device) -> mapping; got 3"),
    ({"inputs": lambda w: {}}, "inputs must take (w, device), but the lambda at"),
    ({"inputs": {"LENS": lambda w: 1}}, "inputs['LENS'] must take (w, device), but the lambda"),
    ({"check": "torch.allclose"}, "check must be a function (w) -> {argument name: expected "
                                  "value}, got 'torch.allclose'"),
    ({"check": lambda w, ref: None}, "check must take (w) -> {argument name: expected value}, "
                                     "but the lambda at"),
]


@pytest.mark.parametrize("kw,message", BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_declarations_name_the_kernel(kw, message):
    with pytest.raises(DeclarationError, match=r"kernel 'inp\d+' \(.*\): " + _escape(message)):
        declare(**kw)


def test_a_range_needs_a_tensor_or_scalar():
    with pytest.raises(DeclarationError, match="a range needs a Tensor or Scalar argument, but a "
                                               "workload passes 1.0"):
        declare({**WORKLOAD, "STEP": 1.0}, inputs={"STEP": (0, 1)})
    with pytest.raises(DeclarationError, match="bool takes no range"):
        declare({**WORKLOAD, "LENS": Tensor((8,), "bool")}, inputs={"LENS": (0, 1)})


# ---- ctbuild plan ----------------------------------------------------------------------------
PROJECT = '''
import cuda.tile as ct
import ctbuild
from ctbuild import Tensor

@ctbuild.autotune(
    space={{"TILE": [16, 32]}},
    grid=lambda cfg, w: (ct.cdiv(w.X.shape[0], cfg.TILE),),
    workloads=[{{"X": Tensor((256, 32), "float32"), "LENS": Tensor((8,), "int32"),
                "IDX": Tensor((8,), "int64"), "Y": Tensor((256, 32), "float32")}}],
    inputs={inputs},
)
@ct.kernel
def {name}(X, LENS, IDX, Y, TILE: ct.Constant[int]):
    bid = ct.bid(0)
    ct.store(Y, index=(bid, 0), tile=ct.load(X, index=(bid, 0), shape=(TILE, 32)))
'''


def plan(tmp_path: Path, capsys, name: str, inputs: str) -> tuple[int, str, str]:
    (tmp_path / f"{name}_mod.py").write_text(PROJECT.format(name=name, inputs=inputs))
    (tmp_path / "ctbuild.toml").write_text(f'modules = ["{name}_mod"]\n')
    code = main(["plan", "--config", str(tmp_path / "ctbuild.toml")])
    out, err = capsys.readouterr()
    return code, out, err


def test_plan_notes_integer_tensors_without_inputs(tmp_path, capsys):
    code, out, err = plan(tmp_path, capsys, "paged_note", "{'LENS': (1, 255)}")
    assert code == 0, err
    notes = [line for line in out.splitlines() if line.startswith("note: paged_note:")]
    assert notes == ["note: paged_note: integer tensor argument(s) IDX have no inputs=; tuning "
                     "fills them with 1..N-1 (N: the smallest extent above 1 of the other tensors): "
                     "declare realistic lengths/indices with inputs= "
                     "(docs/declaring.md#tuning-inputs)"]


def test_plan_fails_on_a_bad_inputs_in_one_line(tmp_path, capsys):
    code, out, err = plan(tmp_path, capsys, "paged_bad", "{'LENS': (1, 255), 'IDS': (0, 7)}")
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and not out and len(lines) == 1, err
    assert "kernel 'paged_bad'" in err and "inputs= names unknown argument 'IDS' (did you mean " \
        "'IDX'?)" in err
