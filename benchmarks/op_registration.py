"""What registering a kernel as a torch op adds per call, by registration style, on a CPU.

    python benchmarks/op_registration.py [--calls 20000] [--rounds 7]

The implementation is a Python function that does nothing (in-place form) or returns
``torch.empty_like`` of its input (out-of-place form), so the figures are the dispatch alone:

  plain:            the function called directly
  direct:           ``torch.library.Library(ns, "FRAGMENT")`` define + impl + register_fake
                    (what ``ctbuild.torch_op`` does, as vLLM's direct_register_custom_op),
                    called as ``torch.ops.ns.op.default(...)``; ``direct (packet)`` as
                    ``torch.ops.ns.op(...)``, which picks the overload per call
  custom_op:        ``@torch.library.custom_op``, called as the object it returns and as
                    ``torch.ops.ns.op.default(...)``

Prints the best of ``--rounds`` rounds of ``--calls`` calls, in us per call, and each style's
cost over the plain call. No GPU is needed: the dispatcher's work is the same for CPU and CUDA
tensors (the served kernel's own cost is ``benchmarks/dispatch_overhead.py``'s ``op`` column).
"""
from __future__ import annotations

import argparse
import time
from typing import Any, Callable


def per_call_us(fn: Callable[..., Any], args: tuple, calls: int, rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            fn(*args)
        best = min(best, (time.perf_counter() - start) / calls * 1e6)
    return best


def styles(torch: Any) -> tuple[Any, dict[str, dict[str, Callable[..., Any]]]]:
    """(the library fragment, which must outlive the calls; per form, in place and out of
    place, each way to reach the same implementation)."""
    def write(x: Any, out: Any) -> None:
        return None

    def make(x: Any) -> Any:
        return torch.empty_like(x)

    ns = "op_registration_bench"
    write_schema, make_schema = "(Tensor x, Tensor(a0!) out) -> ()", "(Tensor x) -> Tensor"
    lib = torch.library.Library(ns, "FRAGMENT")
    for name, fn, schema in (("write", write, write_schema), ("make", make, make_schema)):
        lib.define(name + schema)
        lib.impl(name, fn, "CompositeExplicitAutograd")
        torch.library.register_fake(f"{ns}::{name}", fn, lib=lib)
    co_write = torch.library.custom_op(f"{ns}::co_write", write, mutates_args=("out",),
                                       schema=write_schema)
    co_make = torch.library.custom_op(f"{ns}::co_make", make, mutates_args=(),
                                      schema=make_schema)
    ops = getattr(torch.ops, ns)
    return lib, {
        "in place": {"plain": write, "direct": ops.write.default, "direct (packet)": ops.write,
                     "custom_op": co_write, "custom_op .default": ops.co_write.default},
        "out of place": {"plain": make, "direct": ops.make.default,
                         "direct (packet)": ops.make, "custom_op": co_make,
                         "custom_op .default": ops.co_make.default},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    import torch
    x, out = torch.zeros(16), torch.zeros(16)
    print(f"torch {torch.__version__}, best of {args.rounds} x {args.calls} calls, us per call")
    print(f"{'form':13} {'style':20} {'us':>7} {'over plain':>11}")
    _library, forms = styles(torch)
    for form, ways in forms.items():
        call_args = (x, out) if form == "in place" else (x,)
        times = {name: per_call_us(fn, call_args, args.calls, args.rounds)
                 for name, fn in ways.items()}
        for name, us in times.items():
            print(f"{form:13} {name:20} {us:7.2f} {us - times['plain']:11.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
