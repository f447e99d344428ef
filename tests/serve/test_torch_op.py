"""A declared kernel as a torch op (`ctbuild.torch_op`), on a CPU: the schema from the
declaration, the fake implementation, Dynamo tracing through two ops with no graph break, a call
dispatched to the served kernel (launch stubbed), one-line declaration errors, and the ops
resolving in a fresh process that imported only the module declaring them."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import cuda.tile as ct  # noqa: E402
from conftest import EXAMPLES, ROOT, python_json  # noqa: E402
from gpu_runtime_examples import host_tensors, load_examples  # noqa: E402

import ctbuild  # noqa: E402
from ctbuild import DeclarationError, Product, Scalar, Tensor  # noqa: E402

KERNELS = load_examples()
import demo_kernels.ops  # noqa: E402, F401 - declares torch.ops.demo.silu_mul and .rmsnorm


@ctbuild.autotune(space=Product(TILE=[64, 128]), grid=lambda cfg, w: (1,),
                  workloads=[{"X": Tensor((256,), "float32"), "n": Scalar("int32", 256),
                              "flag": True, "ACC": Tensor((256,), "float32"),
                              "OUT": Tensor((256,), "float16"), "K": 4}])
@ct.kernel
def op_test_kinds(X, n, flag, ACC, OUT, K: ct.Constant[int], TILE: ct.Constant[int]):
    ct.store(OUT, index=(0,), tile=ct.load(X, index=(0,), shape=(TILE,)).astype(OUT.dtype))


@ctbuild.autotune(space=Product(TILE=[64]), grid=lambda cfg, w: (1,), workloads=[
    {"X": Tensor((256,), "float32"), "c": 1.5}, {"X": Tensor((256,), "float32"), "c": 2}])
@ct.kernel
def op_test_mixed(X, c, TILE: ct.Constant[int]):
    ct.store(X, index=(0,), tile=ct.load(X, index=(0,), shape=(TILE,)) * c)


@ctbuild.autotune(space=Product(TILE=[64]), grid=lambda cfg, w: (1,), workloads=[])
@ct.kernel
def op_test_undeclared(X, TILE: ct.Constant[int]):
    ct.store(X, index=(0,), tile=ct.load(X, index=(0,), shape=(TILE,)))


KINDS_INPLACE = ctbuild.torch_op(op_test_kinds, "ctbuild_test::kinds", mutates=("ACC",),
                                 outputs={"OUT": lambda w: torch.empty_like(w.X,
                                                                            dtype=torch.float16)})
#: Two outputs, given in the other order than the kernel takes them.
KINDS_TWO = ctbuild.torch_op(op_test_kinds, "ctbuild_test::kinds_two", outputs={
    "OUT": lambda w: torch.empty_like(w.X, dtype=torch.float16),
    "ACC": lambda w: torch.zeros_like(w["X"])})


def test_the_schema_comes_from_the_declaration() -> None:
    """Tensors, written tensors, a runtime int (symbolic), a compiled-in int, a bool and a
    float, in call order; outputs leave the arguments and are returned."""
    assert str(torch.ops.demo.silu_mul.default._schema) == \
        "demo::silu_mul(Tensor X, Tensor Y) -> Tensor"
    assert str(torch.ops.demo.rmsnorm.default._schema) == \
        "demo::rmsnorm(Tensor X, Tensor W, Tensor(a0!) OUT, float eps) -> ()"
    assert str(KINDS_INPLACE._schema) == ("ctbuild_test::kinds(Tensor X, SymInt n, bool flag, "
                                          "Tensor(a0!) ACC, int K) -> Tensor")
    assert str(KINDS_TWO._schema) == \
        "ctbuild_test::kinds_two(Tensor X, SymInt n, bool flag, int K) -> (Tensor, Tensor)"
    assert demo_kernels.ops.rmsnorm_op is torch.ops.demo.rmsnorm.default


def test_the_fake_gives_outputs_without_launching(stub_gpu: list[tuple]) -> None:
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
    with FakeTensorMode():
        # (a CPU-only torch makes fake CUDA tensors, but cannot view them)
        x = torch.empty(1 << 20, dtype=torch.bfloat16, device="cuda")
        out = torch.ops.demo.silu_mul(x, x)
        rows, w = (torch.empty(512, 2048, dtype=torch.bfloat16, device="cuda") for _ in "ab")
        assert torch.ops.demo.rmsnorm(rows, w, rows, 1e-6) is None
        two = KINDS_TWO(torch.empty(256), 256, True, 4)
    assert isinstance(out, FakeTensor) and out.device.type == "cuda"
    assert (out.shape, out.dtype) == (x.shape, torch.bfloat16)
    assert [(t.shape, t.dtype) for t in two] == [((256,), torch.float16), ((256,), torch.float32)]
    assert stub_gpu == []


def test_dynamo_traces_through_two_ops_in_one_graph() -> None:
    """An op returning a new tensor and an op writing in place, on meta tensors (the fake is
    their meta implementation), compiled whole: ``fullgraph=True`` fails on any graph break."""
    graphs: list[Any] = []

    def count(gm: Any, inputs: list) -> Any:
        graphs.append(gm)
        return gm.forward

    def model(x, y, w):
        h = torch.ops.demo.silu_mul(x, y).view(-1, w.shape[0])
        out = torch.empty_like(h)
        torch.ops.demo.rmsnorm(h, w, out, 1e-6)
        return out * 2 + 1

    x = torch.empty(1 << 20, dtype=torch.bfloat16, device="meta")
    w = torch.empty(2048, dtype=torch.bfloat16, device="meta")
    got = torch.compile(model, fullgraph=True, backend=count)(x, x, w)
    assert (got.shape, got.dtype, got.device.type) == ((512, 2048), torch.bfloat16, "meta")
    assert len(graphs) == 1
    code = graphs[0].code
    assert "torch.ops.demo.silu_mul" in code and "torch.ops.demo.rmsnorm" in code


def test_a_call_launches_the_served_kernel(stub_gpu: list[tuple]) -> None:
    """The in-place op passes its arguments through; the other allocates its outputs and puts
    each in its place among the kernel's arguments."""
    x, w, out, eps = host_tensors(KERNELS["rmsnorm"].workloads[0], values=False)
    assert torch.ops.demo.rmsnorm(x, w, out, eps) is None
    assert stub_gpu[-1][3][:4] == (x, w, out, eps)
    x, y, _ = host_tensors(KERNELS["silu_mul"].workloads[0], values=False)
    made = torch.ops.demo.silu_mul(x, y)
    assert made.shape == x.shape and stub_gpu[-1][3][:3] == (x, y, made)
    x = torch.ones(256)
    new_out, new_acc = KINDS_TWO(x, 256, True, 4)
    assert stub_gpu[-1][3][:6] == (x, 256, True, new_acc, new_out, 4)
    assert len(stub_gpu) == 3


def _mistake(case: str) -> Any:
    """Declare one wrong op; returns what was declared (nothing, when the mistake is caught)."""
    rmsnorm, rope = KERNELS["rmsnorm"], KERNELS["rope_inplace"]
    like_x = {"OUT": lambda w: torch.empty_like(w.X)}
    return {
        "no namespace": lambda: ctbuild.torch_op(rmsnorm, "rmsnorm", mutates=("OUT",)),
        "registered here": lambda: ctbuild.torch_op(rmsnorm, "demo::rmsnorm", outputs=like_x),
        "registered elsewhere": lambda: ctbuild.torch_op(rmsnorm, "aten::add", outputs=like_x),
        "nothing written": lambda: ctbuild.torch_op(rmsnorm, "ctbuild_test::bad"),
        "unknown argument": lambda: ctbuild.torch_op(rmsnorm, "ctbuild_test::bad",
                                                     mutates=("out",)),
        "unknown output": lambda: ctbuild.torch_op(rmsnorm, "ctbuild_test::bad",
                                                   outputs={"Out": like_x["OUT"]}),
        "in both": lambda: ctbuild.torch_op(rmsnorm, "ctbuild_test::bad", mutates=("OUT",),
                                            outputs=like_x),
        "restore unsaid": lambda: ctbuild.torch_op(rope, "ctbuild_test::bad",
                                                   mutates=("COS",)),
        "scalar written": lambda: ctbuild.torch_op(rmsnorm, "ctbuild_test::bad",
                                                   mutates=("eps",)),
        "wrong shape": lambda: ctbuild.torch_op(rmsnorm, "ctbuild_test::bad",
                                                outputs={"OUT": lambda w: torch.empty_like(w.W)}),
        "raises": lambda: ctbuild.torch_op(rmsnorm, "ctbuild_test::bad",
                                           outputs={"OUT": lambda w: torch.empty_like(w.x)}),
        "other device": lambda: ctbuild.torch_op(rmsnorm, "ctbuild_test::bad", outputs={
            "OUT": lambda w: torch.empty(w.X.shape, dtype=w.X.dtype)}),
        "no w": lambda: ctbuild.torch_op(rmsnorm, "ctbuild_test::bad",
                                         outputs={"OUT": lambda: None}),
        "mixed kinds": lambda: ctbuild.torch_op(op_test_mixed, "ctbuild_test::bad",
                                                mutates=("X",)),
        "no workloads": lambda: ctbuild.torch_op(op_test_undeclared, "ctbuild_test::bad",
                                                 mutates=("X",)),
        "not a kernel": lambda: ctbuild.torch_op(rmsnorm.kernel, "ctbuild_test::bad",
                                                 mutates=("OUT",)),
    }[case]()


@pytest.mark.parametrize("case, says", [
    ("no namespace", "an op name needs a namespace: name it 'mylib::rmsnorm'"),
    ("registered here", "'demo::rmsnorm' is already registered on kernel 'rmsnorm' "
                        "(demo_kernels.rmsnorm)"),
    ("registered elsewhere", "'aten::add' is already registered by other code"),
    ("nothing written", "which of its arguments (X, W, OUT, eps) the kernel writes cannot be "
                        "told from its declaration: give mutates=(...)"),
    ("unknown argument", "mutates names unknown argument 'out' (did you mean 'OUT'?)"),
    ("unknown output", "outputs names unknown argument 'Out' (did you mean 'OUT'?)"),
    ("in both", "['OUT'] are in both mutates and outputs"),
    ("restore unsaid", "restore= says the kernel writes ['Q']: add them to mutates="),
    ("scalar written", "'eps' is written, but the workloads declare it as a float"),
    ("wrong shape", "gave float16 (4096,), where the workload declares "
                    "Tensor((4096, 4096), float16)"),
    ("raises", "raised AttributeError: the op has no argument 'x' (arguments: X, W, eps)"),
    ("other device", "it must allocate a tensor on its arguments' device"),
    ("no w", "outputs['OUT'] must take (w), but the lambda at"),
    ("mixed kinds", "argument 'c' is declared as 1.5, 2; an op's argument is a Tensor, or a "
                    "bool, int or float"),
    ("no workloads", "an op takes its argument types from the declared workloads, and this "
                     "kernel declares none"),
    ("not a kernel", "ctbuild.torch_op('ctbuild_test::bad', ...) takes a @ctbuild.autotune"),
])
def test_a_wrong_op_is_one_line_naming_the_kernel(case: str, says: str) -> None:
    with pytest.raises(DeclarationError) as info:
        _mistake(case)
    message = str(info.value)
    assert says in message and "\n" not in message
    if case != "not a kernel":
        assert re.match(r"kernel '\w+' \([\w.]+\): torch op '[\w:]+'[: ]", message), message
    assert not hasattr(torch.ops.ctbuild_test, "bad")  # nothing half-registered


FRESH_SCRIPT = r"""
import json, sys
sys.path[:0] = [{root!r}, {examples!r}]
import ctbuild
torch_with_ctbuild = "torch" in sys.modules
import demo_kernels.ops
import torch
x = torch.empty(1 << 20, dtype=torch.float16, device="meta")
out = torch.ops.demo.silu_mul(x, x)
print(json.dumps({{"torch_with_ctbuild": torch_with_ctbuild,
                   "schemas": [str(torch.ops.demo.silu_mul.default._schema),
                               str(torch.ops.demo.rmsnorm.default._schema)],
                   "out": [list(out.shape), str(out.dtype), out.device.type]}}))
"""


def test_ops_resolve_in_a_fresh_process_that_imported_only_their_module(tmp_path: Path) -> None:
    """The module declaring the ops registers them at its import: nothing else is needed."""
    script = FRESH_SCRIPT.format(root=str(ROOT), examples=str(EXAMPLES))
    got = python_json(script, env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
                      cwd=tmp_path)
    assert got["schemas"] == ["demo::silu_mul(Tensor X, Tensor Y) -> Tensor",
                              "demo::rmsnorm(Tensor X, Tensor W, Tensor(a0!) OUT, float eps) -> ()"]
    assert got["out"] == [[1 << 20], "torch.float16", "meta"]
    assert got["torch_with_ctbuild"] is False  # ctbuild.torch_op imports torch when called
