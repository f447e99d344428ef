"""What `explain` tells a newcomer is right. Its ``fix`` can be pasted and does what it says:
for calls the example kernels' declarations miss (a size, a dtype, a size beyond a `Dim`, a
layout, an alignment, several at once), the suggested edit is pasted into the declaration
(evaluated in the declaring module, as a paste there is), the kernel is declared again and
planned: the call is then covered, and the plan grew by at most one declaration's buckets (a
fix that loses a Dim's buckets, or turns a tensor's Dim into the call's size, plans many
more). A cache of another cuda-tile is named with its version; the grid of a device-sized
kernel is the one the project's ``[devices]`` (or ``gpu=``) gives; explain on a CPU without
``arch=`` says to pass one."""
from __future__ import annotations

import importlib
import sys
from typing import Any

import cuda.tile as ct
import pytest
from conftest import ROOT

import ctbuild
from ctbuild import Dim, Product, Tensor
from ctbuild.arch import Arch
from ctbuild.declare import TunedKernel
from ctbuild.specs import Workload

EXAMPLES = ROOT / "examples"
COVERAGE = ROOT / "tests" / "fixtures" / "coverage_project"
MODULES = {EXAMPLES: ["demo_kernels.elementwise", "demo_kernels.rmsnorm", "demo_kernels.matmul",
                      "demo_kernels.rope", "demo_kernels.dynamic"],
           COVERAGE: ["cov_kernels.kernels", "cov_kernels.derived"]}

#: The issue's case: a batched GEMV over a batch Dim with buckets, declared at three sizes.
B = Dim("B", 1, 64, buckets=(8, 64))


@ctbuild.autotune(
    space=Product(TM=[64, 128]),
    grid=lambda cfg, w: (w.A.shape[0], ct.cdiv(w.A.shape[1], cfg.TM)),
    default={"TM": 64},
    workloads=[{"A": Tensor((B, n, n), "float16"), "X": Tensor((B, n), "float16"),
                "Y": Tensor((B, n), "float16")} for n in (512, 1024, 4096)],
    name="fix_paste_gemv",
)
@ct.kernel
def gemv(A, X, Y, TM: ct.Constant[int]):
    b, i = ct.bid(0), ct.bid(1)
    a = ct.load(A, index=(b, i, 0), shape=(1, TM, 512), padding_mode=ct.PaddingMode.ZERO)
    ct.store(Y, index=(b, i), tile=ct.sum(a, axis=2).astype(Y.dtype))


def _kernels() -> list[TunedKernel]:
    found: list[TunedKernel] = [gemv]
    for path, modules in MODULES.items():
        sys.path.insert(0, str(path))
        for name in modules:
            module = importlib.import_module(name)
            found += [v for v in vars(module).values() if isinstance(v, TunedKernel)
                      and v.module == name and v.name != "bad_grid"]  # (its grid raises)
    return found


def _concrete(w: Workload) -> dict[str, Any]:
    """A call of a declared workload: each Dim at a size inside its range."""
    sizes = {d.name: min(d.hi, max(d.lo, 48)) for v in w.values() if isinstance(v, Tensor)
             for d in v.shape if isinstance(d, Dim)}
    return {k: Tensor(tuple(sizes[d.name] if isinstance(d, Dim) else d for d in v.shape),
                      v.dtype, None, v.align) if isinstance(v, Tensor) else v
            for k, v in w.items()}


def _missed_calls(w: Workload) -> list[dict[str, Any]]:
    """Calls no declaration of the examples has: one thing changed, or several at once."""
    call = _concrete(w)
    first = next(k for k, v in w.items() if isinstance(v, Tensor))
    t = call[first]
    other = "float32" if t.dtype != "float32" else "float16"
    out = [{**call, first: Tensor(t.shape, other)}]
    static = [i for i, d in enumerate(w[first].shape) if not isinstance(d, Dim)]
    if static:  # a size no workload declares (the M=2048), in every tensor holding it
        n = t.shape[static[-1]]
        out.append({k: Tensor(tuple(2 * n if s == n else s for s in v.shape), v.dtype)
                    if isinstance(v, Tensor) else v for k, v in call.items()})
    if t.ndim >= 2:  # a strided view
        strides = (t.shape[-1] * 2, *t.strides[1:]) if t.ndim == 2 else \
            (t.strides[0] * 2, *t.strides[1:])
        out.append({**call, first: Tensor(t.shape, t.dtype, strides)})
    out.append({**call, first: Tensor(t.shape, t.dtype, None, 4)})
    dims = [d for d in w[first].shape if isinstance(d, Dim)]
    if dims:  # beyond the range; and beyond it with another dtype too
        d = dims[0]
        beyond = {k: Tensor(tuple(2 * d.hi if isinstance(s, Dim) and s.name == d.name else c
                                  for s, c in zip(w[k].shape, v.shape)), v.dtype)
                  if isinstance(v, Tensor) else v for k, v in call.items()}
        out += [beyond, {**beyond, first: Tensor(beyond[first].shape, other)}]
    return out


def _pasted(kernel: TunedKernel, fix: str) -> list[Workload]:
    """The declared workloads once ``fix`` is pasted into the declaring module."""
    ns = {**vars(ctbuild), **vars(sys.modules[kernel.module])}
    if fix.startswith("add "):
        text = fix.removeprefix("add ").removesuffix(" to workloads=[...]")
        return [*kernel.declared_workloads, Workload(eval(text, ns))]
    assert fix.startswith("widen "), fix
    swap: dict[Dim, Dim] = {}
    for part in fix.split("; "):
        old, new = part.removeprefix("widen ").removesuffix(" in workloads=[...]").split(" to ")
        swap[eval(old, ns)] = eval(new, ns)
    return [Workload({k: Tensor(tuple(swap.get(d, d) if isinstance(d, Dim) else d
                                      for d in v.shape), v.dtype, v.strides, v.align)
                      if isinstance(v, Tensor) else v for k, v in w.items()})
            for w in kernel.declared_workloads]


def _declared_again(kernel: TunedKernel, workloads: list[Workload]) -> TunedKernel:
    return TunedKernel(kernel.kernel, space=kernel.space, grid=kernel.grid_fn,
                       args=kernel.args_fn, hints=kernel.hints_fn, key=kernel.key_fn,
                       default=kernel.default, workloads=workloads, restore=kernel.restore,
                       reset_to_zero=kernel.reset_to_zero, params=kernel.params,
                       cap=kernel.cap, name=kernel.name, max_splits=kernel.max_splits)


def _buckets(kernel: TunedKernel) -> int:
    from ctbuild.compile.plan import make_plan
    return len(make_plan([kernel], [Arch("sm_90")], "f" * 32).entries)


def test_every_suggested_fix_pastes_covers_the_call_and_keeps_the_buckets(runtime_store
                                                                          ) -> None:
    from ctbuild import runtime
    from ctbuild.dims import buckets
    runtime.configure(store=runtime_store)
    pasted = 0
    for kernel in _kernels():
        before = _buckets(kernel)
        most = max(len(list(buckets(w))) if any(isinstance(d, Dim) for v in w.values()
                                                if isinstance(v, Tensor) for d in v.shape)
                   else 1 for w in kernel.declared_workloads)
        for w in kernel.declared_workloads:
            for call in _missed_calls(w):
                args = [call[p] for p in kernel.params]
                fix = kernel.explain(*args, arch="sm_90").get("fix", "")
                if not fix.startswith(("add ", "widen ")):
                    continue  # covered as it is (a generic CUBIN, a fix that is a command)
                again = _declared_again(kernel, _pasted(kernel, fix))
                why = again.explain(*args, arch="sm_90")["why"]
                assert why[-1].startswith("declared, but"), (kernel.name, fix, why)
                grown = _buckets(again) - before
                assert 0 < grown <= most + 1, (kernel.name, fix, before, grown)
                pasted += 1
    assert pasted >= 40, pasted


def test_gemv_fix_keeps_the_batch_dim_in_every_tensor(runtime_store) -> None:
    """The issue's case: M=2048 undeclared; the fix keeps B (by its name) in A, X and Y."""
    from ctbuild import runtime
    runtime.configure(store=runtime_store)
    fix = gemv.explain(Tensor((8, 2048, 2048), "float16"), Tensor((8, 2048), "float16"),
                       Tensor((8, 2048), "float16"), arch="sm_90")["fix"]
    assert fix == ("add {'A': Tensor((B, 2048, 2048), 'float16'), 'X': Tensor((B, 2048), "
                   "'float16'), 'Y': Tensor((B, 2048), 'float16')} to workloads=[...]")
    assert _buckets(_declared_again(gemv, _pasted(gemv, fix))) == _buckets(gemv) + 2


def test_a_dim_without_a_module_name_is_pasted_in_full() -> None:
    """Where the declaring module has no name for the Dim, its source keeps its buckets."""
    from ctbuild.miss_reasons import covering_edit, gaps
    rows = Dim("ROWS", 1, 4096, buckets=(64, 4096))
    declared = Workload({"X": Tensor((rows, 256), "float16")})
    call = {"X": Tensor((100, 512), "float16")}
    fix = covering_edit(declared, call, gaps(declared, call, frozenset()))
    assert fix == ("add {'X': Tensor((Dim('ROWS', 1, 4096, buckets=(64, 4096)), 512), "
                   "'float16')} to workloads=[...]")
    beyond = {"X": Tensor((5000, 256), "float16")}
    assert covering_edit(declared, beyond, gaps(declared, beyond, frozenset())) == (
        "widen Dim('ROWS', 1, 4096, buckets=(64, 4096)) to Dim('ROWS', 1, 5000, "
        "buckets=(64, 4096, 5000)) in workloads=[...]")


def test_a_cache_of_another_cuda_tile_names_its_version(tmp_path) -> None:
    """The cache is the right one, built under another cuda-tile: the version is the fix, not
    pointing CTBUILD_CACHE_DIR at the cache already used."""
    from ctbuild import cutile, runtime
    from ctbuild.cache import Store
    here = cutile.version()
    other = "1.6.0" if not here.startswith("1.6.") else "1.7.0"
    store = Store(tmp_path / "cache")
    store.put_toolchain("d" * 32, {"cuda_tile": other, "env": {}, "created": 1.0})
    try:
        runtime.configure(store=store)
        x = Tensor((48, 512, 512), "float16")
        r = gemv.explain(x, Tensor((48, 512), "float16"), Tensor((48, 512), "float16"),
                         arch="sm_90")
    finally:
        runtime.reset()
    assert r["why"][0].endswith(f"was built with cuda-tile {other}, but this process has "
                                f"cuda-tile {here}: it can serve nothing here"), r["why"]
    assert r["fix"] == (f"serve with the build's version (pip install 'cuda-tile=={other}'), "
                        f"or rebuild this cache under {here} (ctbuild precompile)")


def test_explain_sizes_the_grid_by_the_projects_devices_and_gpu(tmp_path, runtime_store,
                                                                monkeypatch) -> None:
    from ctbuild import runtime
    from ctbuild.device_table import explain_device
    config = tmp_path / "ctbuild.toml"
    config.write_text('[devices]\nsm_90 = { name = "NVIDIA H20", sm_count = 78 }\n')
    monkeypatch.setenv("CTBUILD_CONFIG", str(config))
    sys.path.insert(0, str(COVERAGE))
    from cov_kernels.kernels import persistent_scale
    runtime.configure(store=runtime_store)
    x = Tensor((1 << 20,), "float32")
    plain = persistent_scale.explain(x, x, arch="sm_90")
    assert plain["grid"] == [78] and plain["grid_device"] == (
        f"NVIDIA H20, 78 SMs ([devices] sm_90 in {config})")
    h100 = persistent_scale.explain(x, x, arch="sm_90", gpu="NVIDIA H100 80GB HBM3")
    assert h100["grid"] == [132] and h100["grid_device"].endswith("(ctbuild's table)")
    _, unknown = explain_device("sm_90", "NVIDIA H800", None)
    assert "its SM count is unknown, so that of [devices] sm_90" in unknown
    assert 'give it in ctbuild.toml: [devices] sm_90 = { name = "NVIDIA H800", sm_count = N }' \
        in unknown


def test_explain_on_a_cpu_without_arch_says_to_pass_one(runtime_store) -> None:
    from ctbuild import runtime
    from ctbuild.serve.errors import KernelCallError
    runtime.configure(store=runtime_store)
    x = Tensor((8, 512, 512), "float16")
    with pytest.raises(KernelCallError, match=r"no CUDA tensor tells which GPU to explain for; "
                                              r"pass arch= .*fix_paste_gemv.explain\(\.\.\., "
                                              r"arch='sm_90'\)"):
        gemv.explain(x, Tensor((8, 512), "float16"), Tensor((8, 512), "float16"))
