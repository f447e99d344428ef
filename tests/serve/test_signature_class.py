"""`signature_class`: argument lists of one class derive one signature, so the runtime derives a
`Dim` bucket's signature once per class instead of once per size (`Resolver._signature`).

Checked on the generated signature cases (random tensors of every dtype, alignment, stride and
size-1/size-0 pattern, lists, tuples, scalars, constants, static-dim annotations) and on each
case with its sizes moved within their class: equal classes must derive equal signatures, or
both be refused.
"""
from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

TESTS = Path(__file__).resolve().parents[1]
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

import cuda.tile as ct  # noqa: E402
import signature_cases as sc  # noqa: E402

from ctbuild.signature import derive_signature, signature_class, signature_text  # noqa: E402
from ctbuild.specs import Tensor, contiguous_strides  # noqa: E402


def _outcome(kernel: Any, args: tuple) -> str:
    try:
        return signature_text(derive_signature(kernel, args, mangled=False))
    except Exception as exc:  # the refusal is part of the outcome a class must fix
        return f"refused: {type(exc).__name__}"


def _moved(arg: Any, by: int) -> Any:
    """``arg`` with each size above 1 grown by ``16 * by`` (same size-1 and divisibility
    facts; contiguous strides follow, so stride facts may change: then the class does)."""
    if isinstance(arg, Tensor):
        shape = tuple(n + 16 * by if n > 1 else n for n in arg.shape)
        strides = contiguous_strides(shape) if arg.strides == contiguous_strides(arg.shape) \
            else arg.strides
        return Tensor(shape, arg.dtype, strides, arg.align)
    if isinstance(arg, list):
        return [_moved(a, by) for a in arg]
    if isinstance(arg, tuple):
        return tuple(_moved(a, by) for a in arg)
    return arg


def test_one_class_derives_one_signature() -> None:
    groups: dict[tuple, set[str]] = defaultdict(set)
    shapes: dict[tuple, set[str]] = defaultdict(set)
    classed = 0
    cases = sc.generate_cases(600, seed=7)
    for case in cases:
        kernel = ct.kernel(sc.KERNELS[case.kernel])
        for by in (0, 1, 5):
            args = tuple(_moved(a, by) for a in case.args)
            cls = signature_class(kernel, args)
            if cls is None:
                continue
            classed += 1
            groups[case.kernel, cls].add(_outcome(kernel, args))
            shapes[case.kernel, cls].add(repr(args))
    split = {k: v for k, v in groups.items() if len(v) > 1}
    assert not split, f"{len(split)} classes derive more than one signature: " \
                      f"{next(iter(split.values()))}"
    # The check has teeth: most cases have a class, and classes do merge different sizes.
    assert classed > 1200
    assert sum(1 for v in shapes.values() if len(v) > 1) > 300


def test_what_is_read_exactly_has_no_class() -> None:
    """Static-dim annotations read sizes exactly; values that are not specs cannot be classed."""
    static = ct.kernel(sc.KERNELS["k_static"])
    t = Tensor((64, 64), "float16", (64, 1))
    assert signature_class(static, (t, t, t)) is None
    one = ct.kernel(sc.KERNELS["k_one"])
    assert signature_class(one, (object(),)) is None
    assert signature_class(one, ()) is None
    mixed = ct.kernel(sc.KERNELS["k_const"])
    a = Tensor((16,), "float32", (1,))
    # (1, 2) == (1.0, 2) as tuples, but they are different constants
    assert signature_class(mixed, (a, (1, 2), True, 1.0)) != \
        signature_class(mixed, (a, (1.0, 2), True, 1.0))
    # strides of one class, one layout overlapping itself: the aliasing flag tells them apart
    apart, overlapping = Tensor((2, 3), "float32", (3, 1)), Tensor((2, 3), "float32", (2, 1))
    assert _outcome(one, (apart,)) != _outcome(one, (overlapping,))
    assert signature_class(one, (apart,)) != signature_class(one, (overlapping,))
    # a size's class: 1, divisible by 16, other
    assert len({signature_class(one, (Tensor((n,), "float32", (1,)),)) for n in
                (1, 16, 32, 17, 33)}) == 3
