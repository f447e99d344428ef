"""Parity of `ctbuild.signature.derive_signature` with cuTile's own C++ dispatcher, on a CPU.

cuTile's extension needs libcuda only for cuInit, the driver version and pointer/context queries,
all reached through ``cuGetProcAddress_v2``. We compile a stub ``libcuda.so.1``
(tests/stub_libcuda.c) into a tmp dir and run the real dispatcher in one subprocess with
``LD_LIBRARY_PATH`` pointing there, feeding it ``__cuda_array_interface__`` arrays whose pointers
carry the alignment each spec declares. The subprocess walks the real launch path
(``ct.launch`` on a kernel subclass whose ``_compile`` raises with the signature it is given), so
the calling convention is the one the launch picks, not one we chose; it also asks
``KernelSignature.from_kernel_args`` with that convention. Each generated case must give the same
constraints, calling convention and mangled symbol as ``derive_signature``.

Run as a script (``python tests/serve/test_signature_parity.py --dispatcher``) it is that subprocess.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

TESTS = Path(__file__).resolve().parents[1]  # signature_cases.py is shared with tests/gpu/
ROOT = TESTS.parent
for p in (str(ROOT), str(TESTS)):
    if p not in sys.path:
        sys.path.insert(0, p)

import signature_cases as sc  # noqa: E402

#: CI runs the default cases; ``CTBUILD_PARITY_CASES=12000 CTBUILD_PARITY_SEED=1`` runs a fuzz
#: campaign through the same test (read here, so the dispatcher subprocess sees the same cases).
CASES = sc.generate_cases(int(os.environ.get("CTBUILD_PARITY_CASES", "240")),
                          int(os.environ.get("CTBUILD_PARITY_SEED", "20250")))


# --- the subprocess side (real dispatcher on the stub libcuda) ------------------------------
def _dispatcher_main() -> None:
    import cuda.tile as ct
    from cuda.tile.compilation import KernelSignature

    from ctbuild.signature import derive_signature

    class Captured(Exception):
        pass

    class SpyKernel(ct.kernel):
        """A kernel whose compile step hands back the signature the launch derived."""
        def _compile(self, signature, context, compute_capability=None):
            raise Captured(signature)

    kernels = {name: SpyKernel(f) for name, f in sc.KERNELS.items()}

    out = []
    for n, case in enumerate(CASES):
        def make_array(spec, slot, n=n):
            # Half the arrays whose strides are CAI's implicit ones omit them, to cover both
            # paths; not where the dispatcher's int32 row-major strides would refuse them
            # (a spec describes an array that passes its strides).
            explicit = not (spec.strides == sc.cai_implicit_strides(spec.shape)
                            and (slot + n) % 2 == 1 and sc.cai_implicit_ok(spec.shape))
            return sc.FakeCudaArray(spec, sc.fake_pointer(spec, slot), explicit)

        kernel = kernels[case.kernel]
        rec: dict[str, Any] = {"id": case.id}
        try:
            args = sc.runtime_args(case.args, make_array)
            try:
                ct.launch(0, (1, 1, 1), kernel, args)
                raise RuntimeError("launch did not reach _compile")
            except Captured as c:
                launched = c.args[0]
            real = launched.with_mangled_symbol(kernel._pyfunc.__name__)
            via_api = KernelSignature.from_kernel_args(kernel, args, real.calling_convention)
            rec.update(repr=repr(real), symbol=real.symbol, cconv=real.calling_convention.code,
                       api_agrees=via_api == real)
            try:
                rec["derived_equal"] = derive_signature(kernel, case.args) == real
            except Exception as e:  # reported, compared in the parent
                rec["derived_equal"] = False
                rec["derived_error"] = f"{type(e).__name__}: {e}"
        except Exception as e:
            rec["error"] = f"{type(e).__name__}: {e}"
        out.append(rec)
    json.dump(out, sys.stdout)


# --- signature classes: the dispatcher's signatures, weakened, are the planned CUBINs --------
COVERAGE_PROJECT = ROOT / "tests" / "fixtures" / "coverage_project"
CLASS_FP = "f" * 32
CLASS_KERNELS = ("dyn_matmul", "dyn_add", "dyn_center_rows")


def class_calls() -> list[dict[str, Any]]:
    """Random calls of the dynamic fixture kernels: sizes across each range (1 and hi among
    them) in contiguous, misaligned and (for the matmul) transposed layouts."""
    import random
    rng = random.Random(12)
    calls = []
    for name in CLASS_KERNELS:
        for i in range(24):
            size = (1, 17, 4095)[i] if i < 3 else rng.randint(1, 8192)
            layout = ("contiguous", "contiguous", "misaligned", "transposed")[i % 4]
            calls.append({"kernel": name, "size": size, "layout": layout})
    return calls


def class_call_specs(tuned: Any, call: dict[str, Any]) -> tuple[Any, Any]:
    """(workload spec, default config) of one generated call."""
    from ctbuild.dims import concretize, dims_of
    from ctbuild.specs import Tensor, Workload
    declared = tuned.dynamic_workloads[0]
    w = dict(concretize(declared, {n: call["size"] for n in dims_of(declared)}))
    first = next(iter(w))
    t = w[first]
    if call["layout"] == "misaligned":
        w[first] = Tensor(t.shape, t.dtype, t.strides, 4)
    elif call["layout"] == "transposed" and t.ndim == 2:
        w[first] = Tensor(t.shape, t.dtype, (1, t.shape[0]))
    spec_w = Workload(w)
    return spec_w, tuned.default_config(spec_w)


def _classes_main() -> None:
    """Subprocess side: launch each call through the real dispatcher, weaken the signature it
    derived under every class of the lattice, print the compile keys."""
    import cuda.tile as ct

    from ctbuild.keys import kernel_compile_key
    from ctbuild.signature_classes import dynamic_patterns, lattice, weaken

    sys.path.insert(0, str(COVERAGE_PROJECT))
    import cov_kernels.kernels as kernels

    class Captured(Exception):
        pass

    class SpyKernel(ct.kernel):
        def _compile(self, signature, context, compute_capability=None):
            raise Captured(signature)

    out = []
    for n, call in enumerate(class_calls()):
        tuned = getattr(kernels, call["kernel"])
        spec_w, cfg = class_call_specs(tuned, call)
        spy = SpyKernel(tuned.pyfunc)
        args = sc.runtime_args(tuned.kernel_args(cfg, spec_w),
                               lambda spec, slot, n=n: sc.FakeCudaArray(
                                   spec, sc.fake_pointer(spec, slot + 8 * n)))
        try:
            ct.launch(0, (1, 1, 1), spy, args)
            raise RuntimeError("launch did not reach _compile")
        except Captured as c:
            real = c.args[0]
        keys = {}
        for weakening in lattice(dynamic_patterns(tuned, cfg)):
            sig = weaken(real, weakening, tuned.pyfunc.__name__)
            keys.setdefault(weakening.cls, kernel_compile_key(tuned, cfg, sig, "sm_90", CLASS_FP))
        out.append({**call, "cconv": real.calling_convention.code, "keys": keys})
    json.dump(out, sys.stdout)


# --- the pytest side -------------------------------------------------------------------------
@pytest.fixture(scope="session")
def dispatcher_results(stub_libcuda_dir: Path) -> dict[str, dict[str, Any]]:
    """Run the real dispatcher over all cases once, in a subprocess that loads the stub."""
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(
        p for p in (str(stub_libcuda_dir), env.get("LD_LIBRARY_PATH", "")) if p)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--dispatcher"],
                          env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, f"dispatcher subprocess failed:\n{proc.stderr[-4000:]}"
    results = json.loads(proc.stdout)
    assert [r["id"] for r in results] == [c.id for c in CASES]
    return {r["id"]: r for r in results}


def test_case_count_and_coverage() -> None:
    """The generator covers what the rules depend on (so a narrowed generator fails here)."""
    from ctbuild.specs import Tensor

    tensors: list[Tensor] = []

    def walk(a: Any) -> None:
        if isinstance(a, Tensor):
            tensors.append(a)
        elif isinstance(a, (list, tuple)):
            for x in a:
                walk(x)
    for c in CASES:
        walk(c.args)
    assert len(CASES) >= 200
    assert {t.dtype for t in tensors} >= set(sc.DTYPES)
    assert {t.align for t in tensors} >= {2, 4, 8, 16, 256}
    assert any(t.ndim == 6 for t in tensors) and any(t.ndim == 0 for t in tensors)
    assert any(0 in t.strides for t in tensors) and any(1 in t.shape for t in tensors)
    assert any(0 in t.shape for t in tensors)  # empty batches
    assert any(t.strides == sc.cai_implicit_strides(t.shape) != sc.contiguous_strides(t.shape)
               for t in tensors)  # size-0 dims whose implicit strides differ from torch's
    assert any(s < 0 for t in tensors for s in t.strides)
    assert len({c.kernel for c in CASES}) == len(sc.KERNELS)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_signature_parity(case: sc.Case, dispatcher_results: dict[str, dict[str, Any]]) -> None:
    import cuda.tile as ct

    from ctbuild.signature import SignatureError, derive_signature

    real = dispatcher_results[case.id]
    kernel = ct.kernel(sc.KERNELS[case.kernel])
    if case.expect_error or "error" in real:
        assert "error" in real, "the dispatcher accepted an argument list we expect it to refuse"
        with pytest.raises(SignatureError):
            derive_signature(kernel, case.args)
        return
    assert real["api_agrees"], "launch path and KernelSignature.from_kernel_args disagree"
    derived = derive_signature(kernel, case.args)
    assert derived.calling_convention.code == real["cconv"]
    assert repr(derived) == real["repr"]
    assert derived.symbol == real["symbol"]
    assert real["derived_equal"], real.get("derived_error", "derive_signature != dispatcher (==)")


def test_scalar_specs_the_dispatcher_cannot_produce() -> None:
    """A Scalar spec of a dtype no Python value launches as is refused, not silently keyed."""
    import cuda.tile as ct

    from ctbuild.signature import SignatureError, derive_signature
    from ctbuild.specs import Scalar, Tensor

    x = Tensor((16,), "float32")
    k2, km = ct.kernel(sc.k_two), ct.kernel(sc.k_mixed)
    for dtype in ("float64", "float16", "int8", "int64"):
        with pytest.raises(SignatureError):
            derive_signature(k2, (x, x, Scalar(dtype)))
    sig = derive_signature(km, (x, x, Scalar("int64"), 1.0, True, 1))
    assert sig.parameters[2].dtype == ct.int64


def test_signature_classes_parity(stub_libcuda_dir: Path) -> None:
    """Build and serve agree bit for bit: the real dispatcher's signature of every random call,
    weakened by the runtime's lattice, gives exactly the keys the plan precompiles (relaxed for
    every size of the range, generic for every layout) and the keys the runtime derives from
    specs on the CPU."""
    from ctbuild.arch import Arch
    from ctbuild.compile.plan import make_plan
    from ctbuild.signature import derive_signature

    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(
        p for p in (str(stub_libcuda_dir), env.get("LD_LIBRARY_PATH", "")) if p)
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--classes"], env=env,
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, f"dispatcher subprocess failed:\n{proc.stderr[-4000:]}"
    results = json.loads(proc.stdout)
    assert len(results) == len(class_calls())
    sys.path.insert(0, str(COVERAGE_PROJECT))
    import cov_kernels.kernels as kernels

    from ctbuild.serve.served_kernel import CubinSource
    tuned = {n: getattr(kernels, n) for n in CLASS_KERNELS}
    plan = make_plan(list(tuned.values()), [Arch("sm_90")], CLASS_FP)
    planned = {n: {c: {k for k, j in plan.jobs.items() if j.kernel == n and j.cubin_class == c}
                   for c in ("exact", "relaxed", "generic")} for n in CLASS_KERNELS}
    source = CubinSource(None, CLASS_FP)
    size_one = 0
    for r in results:
        k = tuned[r["kernel"]]
        keys, mine = r["keys"], planned[r["kernel"]]
        assert keys["generic"] in mine["generic"], r
        if r["layout"] == "contiguous":
            assert keys["relaxed"] in mine["relaxed"] | mine["exact"], r
        spec_w, cfg = class_call_specs(k, r)
        derived = derive_signature(k.kernel, k.kernel_args(cfg, spec_w))
        on_cpu = {}
        for weakening, _, key in source.candidates(k, cfg, derived, "sm_90"):
            on_cpu.setdefault(weakening.cls, key)
        assert on_cpu == keys, r
        size_one += r["size"] == 1 and r["cconv"] == "t2"
    assert size_one == len(CLASS_KERNELS)  # size 1 went through calling convention v2


if __name__ == "__main__" and "--dispatcher" in sys.argv:
    _dispatcher_main()
if __name__ == "__main__" and "--classes" in sys.argv:
    _classes_main()
