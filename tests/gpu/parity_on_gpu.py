"""GPU-side signature parity: `derive_signature` vs cuTile's dispatcher on real torch tensors.

Builds real CUDA tensors (as strided views of one allocation, offset so the base pointer has the
alignment each spec declares) for the generated cases of tests/signature_cases.py that torch can
express, and compares `derive_signature(kernel, specs)` with
 - the signature the real launch path derives (``ct.launch`` on a kernel whose ``_compile``
   raises with it: nothing is compiled or run), calling convention and mangled symbol included;
 - ``KernelSignature.from_kernel_args`` with that calling convention.
The GPU is the final judge: the CPU test runs the same dispatcher on a stub libcuda and fake
``__cuda_array_interface__`` arrays, this one on what torch hands over (DLPack).

Usage: python tests/gpu/parity_on_gpu.py [--limit 100] [--all]; prints "N passed, M failed" and
exits 1 on any failure.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
for p in (str(HERE.parent.parent), str(HERE.parent)):
    if p not in sys.path:
        sys.path.insert(0, p)

import signature_cases as sc  # noqa: E402


def torch_tensor(spec: Any, slot: int) -> Any:
    """A CUDA tensor view with the spec's shape, strides and base alignment."""
    import torch

    dtype = torch.bool if spec.dtype == "bool" else getattr(torch, spec.dtype)
    itemsize = torch.empty((), dtype=dtype).element_size()
    offset = spec.align // itemsize if spec.align < 256 else 0
    span = 1 + sum((n - 1) * s for n, s in zip(spec.shape, spec.strides)) if all(spec.shape) else 1
    storage = torch.zeros(offset + max(span, 1), dtype=dtype, device="cuda")
    t = storage.as_strided(spec.shape, spec.strides, offset)
    ptr = t.data_ptr()
    if t.numel() == 0:  # torch gives a tensor with no element a null pointer (`as_torch_sees`)
        assert ptr == 0, (spec, hex(ptr))
    else:
        assert (ptr % 16 == 0) == (spec.align % 16 == 0), (spec, hex(ptr))
    return t


def as_torch_sees(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """The specs of ``args`` as the live tensors have them: an empty tensor's base pointer is
    null, so fully aligned, whatever its storage (what `spec_of` records at run time)."""
    import dataclasses

    from ctbuild.serve.live_args import MAX_ALIGN
    from ctbuild.specs import Tensor

    def conv(a: Any) -> Any:
        if isinstance(a, Tensor):
            return dataclasses.replace(a, align=MAX_ALIGN) if 0 in a.shape else a
        if isinstance(a, (list, tuple)):
            return type(a)(conv(x) for x in a)
        return a
    return tuple(conv(a) for a in args)


def run(limit: int | None = 100, verbose: bool = True) -> tuple[int, int, list[str]]:
    """Compare all torch-expressible cases (the first ``limit``); returns (passed, failed, why)."""
    import cuda.tile as ct
    import torch
    from cuda.tile.compilation import KernelSignature

    from ctbuild.signature import derive_signature

    class Captured(Exception):
        pass

    class SpyKernel(ct.kernel):
        def _compile(self, signature, context, compute_capability=None):
            raise Captured(signature)

    cases = [c for c in sc.generate_cases() if c.torch_ok and not c.expect_error]
    if limit is not None:
        cases = cases[:limit]
    stream = torch.cuda.current_stream()
    passed, failures = 0, []
    for case in cases:
        kernel = SpyKernel(sc.KERNELS[case.kernel])
        try:
            args = sc.runtime_args(case.args, torch_tensor)
            derived = derive_signature(kernel, as_torch_sees(case.args))
            try:
                ct.launch(stream, (1, 1, 1), kernel, args)
                raise RuntimeError("launch did not reach _compile")
            except Captured as c:
                real = c.args[0].with_mangled_symbol(sc.KERNELS[case.kernel].__name__)
            api = KernelSignature.from_kernel_args(kernel, args, real.calling_convention)
            problems = []
            if derived != real or repr(derived) != repr(real):
                problems.append(f"derived {derived!r}\n    launch  {real!r}")
            if api != real:
                problems.append(f"from_kernel_args {api!r} != launch")
            if derived.symbol != real.symbol:
                problems.append(f"symbol {derived.symbol} != {real.symbol}")
        except Exception as e:  # a crash is a failure of that case, not of the run
            problems = [f"{type(e).__name__}: {e}"]
        if problems:
            failures.append(f"{case.id}: " + "\n  ".join(problems))
        else:
            passed += 1
    if verbose:
        for f in failures:
            print("FAIL", f)
        print(f"{passed} passed, {len(failures)} failed")
    return passed, len(failures), failures


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=int, default=100)
    ap.add_argument("--all", action="store_true", help="every torch-expressible case")
    ns = ap.parse_args()
    _, failed, _ = run(None if ns.all else ns.limit)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
