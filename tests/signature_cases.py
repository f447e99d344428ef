"""Generated signature-parity cases, shared by the CPU parity test and the GPU parity script.

Importable without torch (the CPU test feeds the dispatcher fake ``__cuda_array_interface__``
arrays; the GPU script builds real torch tensors from the same specs). Everything is seeded, so
every process that calls `generate_cases()` sees the same cases in the same order.

A case is a kernel (a plain annotated function, wrapped by the caller in ``ct.kernel`` or a
subclass) and its arguments as ctbuild specs: `Tensor` specs, lists/tuples of them, `Scalar`
specs, Python scalars and constant values. ``torch_ok`` is False where torch cannot build the
tensor (negative strides); ``expect_error`` marks cases the dispatcher must refuse.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Annotated, Any, Callable

import cuda.tile as ct

from ctbuild.specs import DTYPE_BITS, Scalar, Tensor, contiguous_strides

DTYPES = ("float16", "bfloat16", "float32", "int8", "int32", "int64", "float64", "bool")
#: typestr of each dtype in ``__cuda_array_interface__`` (cuTile reads bfloat16 from "<V2").
TYPESTR = {"float16": "<f2", "bfloat16": "<V2", "float32": "<f4", "float64": "<f8",
           "int8": "|i1", "int16": "<i2", "int32": "<i4", "int64": "<i8", "uint8": "|u1",
           "uint16": "<u2", "uint32": "<u4", "uint64": "<u8", "bool": "|b1"}
ALIGNS = (1, 2, 4, 8, 16, 256)
MAX_NUMEL_SPAN = 1 << 22  # keeps GPU storage small


# --- kernels (plain functions; callers wrap them) -------------------------------------------
def k_one(a):
    pass


def k_two(a, b, n):
    pass


def k_three(a, b, c, alpha, beta):
    pass


def k_mixed(a, x: ct.IndexedWithInt64, n: ct.ScalarInt64, f, flag, C: ct.Constant[int]):
    pass


def k_const(a, C: ct.Constant, D: ct.Constant[bool], E: ct.Constant[float]):
    pass


def k_tuple(a, t):
    pass


def k_tuple_ann(t: tuple[ct.IndexedWithInt64, ct.ScalarInt64, ct.Constant[int]],
                u: tuple[int, ...]):
    pass


def k_leaf_on_tuple(t: ct.ScalarInt64, u: ct.IndexedWithInt64, c: ct.Constant):
    pass


StaticShape0 = Annotated[ct.Array, ct.ArrayAnnotation(static_shape_dims=(0,))]
StaticStrideLast = Annotated[ct.Array, ct.ArrayAnnotation(static_stride_dims=(-1,))]
StaticBoth64 = Annotated[ct.Array, ct.ArrayAnnotation(index_dtype=ct.int64, static_shape_dims=(-1,),
                                                      static_stride_dims=(0,))]


def k_static(a: StaticShape0, b: StaticStrideLast, c: StaticBoth64):
    pass


def k_stride_only(b: StaticStrideLast, n):
    pass


def k_list(xs, ys: Annotated[list, ct.ListAnnotation(element=ct.IndexedWithInt64)], n):
    pass


def k_6d(a, b: ct.IndexedWithInt64):
    pass


KERNELS: dict[str, Callable[..., None]] = {f.__name__: f for f in (
    k_one, k_two, k_three, k_mixed, k_const, k_tuple, k_tuple_ann, k_leaf_on_tuple, k_static,
    k_stride_only, k_list, k_6d)}


@dataclass(frozen=True)
class Case:
    id: str
    kernel: str
    args: tuple[Any, ...]
    torch_ok: bool = True
    expect_error: bool = False


# --- tensor recipes --------------------------------------------------------------------------
_DIMS = (1, 2, 3, 5, 7, 8, 16, 17, 32, 48, 64, 100, 128, 256)


def _shape(rng: random.Random, ndim: int, size1: float = 0.0) -> tuple[int, ...]:
    while True:
        shape = tuple(1 if rng.random() < size1 else rng.choice(_DIMS[1:]) for _ in range(ndim))
        if math.prod(shape) <= MAX_NUMEL_SPAN // 4:
            return shape


def _align(rng: random.Random, dtype: str) -> int:
    itemsize = DTYPE_BITS[dtype] // 8
    return rng.choice([a for a in ALIGNS if a >= itemsize])


def _tensor(rng: random.Random, *, ndim: int | None = None, dtype: str | None = None,
            recipe: str | None = None, allow_negative: bool = False) -> Tensor:
    """A tensor spec that torch can build as a view (except with negative strides)."""
    dtype = dtype or rng.choice(DTYPES)
    ndim = rng.randint(1, 4) if ndim is None else ndim
    recipes = ["contiguous", "permuted", "broadcast", "sliced", "padded", "size1", "empty"]
    if allow_negative:
        recipes += ["negative", "huge"]
    recipe = recipe or rng.choice(recipes)
    align = 256 if rng.random() < 0.5 else _align(rng, dtype)
    if ndim == 0:
        return Tensor((), dtype, (), align)
    if recipe == "contiguous":
        shape = _shape(rng, ndim, 0.1)
        return Tensor(shape, dtype, contiguous_strides(shape), align)
    if recipe == "permuted":
        shape = _shape(rng, ndim, 0.1)
        perm = list(range(ndim))
        rng.shuffle(perm)
        base = contiguous_strides(shape)
        return Tensor(tuple(shape[p] for p in perm), dtype, tuple(base[p] for p in perm), align)
    if recipe == "broadcast":
        shape = _shape(rng, ndim, 0.2)
        strides = list(contiguous_strides(shape))
        for i in rng.sample(range(ndim), rng.randint(1, ndim)):
            strides[i] = 0
        return Tensor(shape, dtype, tuple(strides), align)
    if recipe == "sliced":
        # x[::step0, ..., :k] of a contiguous parent: strides scaled by (often odd) steps.
        shape = _shape(rng, ndim, 0.1)
        parent = tuple(n * rng.choice((1, 2, 3)) + rng.choice((0, 1, 5)) for n in shape)
        steps = [rng.choice((1, 1, 2, 3)) for _ in shape]
        base = contiguous_strides(parent)
        shape = tuple(max(1, min(n, (p - 1) // st + 1)) for n, p, st in zip(shape, parent, steps))
        return Tensor(shape, dtype, tuple(b * st for b, st in zip(base, steps)), align)
    if recipe == "padded":
        # rows padded to an odd or 16-byte pitch, as from x[:, :n] of a wider buffer.
        shape = _shape(rng, ndim, 0.0)
        strides, acc = [], 1
        for n in reversed(shape):
            strides.append(acc)
            acc = acc * n + rng.choice((0, 1, 3, 8, 16, 64))
        return Tensor(shape, dtype, tuple(reversed(strides)), align)
    if recipe == "size1":
        shape = _shape(rng, ndim, 0.5)
        if 1 not in shape:
            shape = shape[:-1] + (1,)
        strides = list(contiguous_strides(shape))
        for i, n in enumerate(shape):
            if n == 1 and rng.random() < 0.5:
                strides[i] = rng.choice((0, 1, 3, 16, 4096))  # torch leaves these arbitrary
        return Tensor(shape, dtype, tuple(strides), align)
    if recipe == "empty":
        # a zero-size batch: some dims 0, strides as torch gives them, as an
        # __cuda_array_interface__ without strides implies, or of a wider parent
        shape = list(_shape(rng, ndim, 0.2))
        for i in rng.sample(range(ndim), rng.randint(1, max(1, ndim // 2))):
            shape[i] = 0
        kind = rng.choice(("torch", "cai", "parent"))
        if kind == "torch":
            strides = contiguous_strides(shape)
        elif kind == "cai":
            strides = cai_implicit_strides(tuple(shape))
        else:
            strides = tuple(rng.choice((0, 1, 3, 16, 4096)) for _ in shape)
        return Tensor(tuple(shape), dtype, strides, align)
    if recipe == "huge":
        # strides at the edge of what the launch accepts (bytes as a C long), either side
        if rng.random() < 0.3:  # dims whose row-major strides pass int32, or int64
            shape = tuple(rng.choice((2, 3, 2**16, 2**31 - 1, 2**31, 2**33, 2**62, 2**63))
                          for _ in range(ndim))
            return Tensor(shape, dtype, cai_implicit_strides(shape), align)
        shape = _shape(rng, ndim, 0.0)
        strides = list(contiguous_strides(shape))
        itemsize = DTYPE_BITS[dtype] // 8
        edge = (2**63 - 1) // itemsize
        strides[rng.randrange(ndim)] = rng.choice((edge, edge + 1, -edge, -edge - 1, 2**40,
                                                   2**62 // itemsize, 2**31, -2**31 - 1))
        return Tensor(shape, dtype, tuple(strides), align)
    if recipe == "negative":
        shape = _shape(rng, ndim, 0.0)
        strides = list(contiguous_strides(shape))
        strides[rng.randrange(ndim)] *= -1
        return Tensor(shape, dtype, tuple(strides), align)
    raise AssertionError(recipe)


def _int(rng: random.Random, wide: bool = False) -> int:
    if wide and rng.random() < 0.5:
        return rng.choice((2**31, 2**40, -2**35, 2**63 - 1))
    return rng.choice((0, 1, -1, 7, 4096, 2**31 - 1, -2**31, rng.randint(-10**6, 10**6)))


def _scalar(rng: random.Random) -> Any:
    return rng.choice((_int(rng), rng.choice((0.0, 1.5, -2.25, 1e30)), True, False,
                       Scalar("int32"), Scalar("float32", 0.5), Scalar("bool")))


def _constant(rng: random.Random) -> Any:
    return rng.choice((0, 1, 2, 16, 128, -3, True, False, 1.0, 0.5, 2**40))


def _any_arg(rng: random.Random, depth: int = 0) -> Any:
    r = rng.random()
    if r < 0.45:
        return _tensor(rng)
    if r < 0.8 or depth >= 2:
        return _scalar(rng)
    return tuple(_any_arg(rng, depth + 1) for _ in range(rng.randint(0, 3)))


def _args(rng: random.Random, kernel: str) -> tuple[tuple[Any, ...], bool]:
    t = lambda **kw: _tensor(rng, **kw)  # noqa: E731
    if kernel == "k_one":
        return (t(ndim=rng.randint(0, 5), allow_negative=True),), True
    if kernel == "k_two":
        return (t(), t(), _int(rng)), True
    if kernel == "k_three":
        dtype = rng.choice(DTYPES)
        return (t(dtype=dtype), t(dtype=dtype), t(dtype=dtype), rng.choice((1.0, 0.5)),
                rng.choice((0, 1, 2.0, True))), True
    if kernel == "k_mixed":
        n = Scalar("int64") if rng.random() < 0.2 else _int(rng, wide=True)
        return (t(), t(ndim=rng.randint(1, 3)), n, rng.choice((1.0, -0.5, 3)),
                rng.choice((True, False)), _constant(rng)), True
    if kernel == "k_const":
        return (t(), _constant(rng), rng.choice((True, False)), rng.choice((1.0, 2.5))), True
    if kernel == "k_tuple":
        return (t(), tuple(_any_arg(rng) for _ in range(rng.randint(0, 3)))), True
    if kernel == "k_tuple_ann":
        return ((t(), _int(rng, wide=True), _constant(rng)),
                tuple(_int(rng) for _ in range(rng.randint(0, 4)))), True
    if kernel == "k_leaf_on_tuple":
        return (tuple(_int(rng, wide=True) for _ in range(rng.randint(1, 3))),
                tuple(t() for _ in range(rng.randint(1, 2))),
                (_constant(rng), (_constant(rng), _constant(rng)))), True
    if kernel == "k_static":
        return (t(ndim=rng.randint(1, 4)), t(ndim=rng.randint(1, 4)), t(ndim=rng.randint(1, 6))), True
    if kernel == "k_stride_only":
        return (t(ndim=rng.randint(1, 4)), _int(rng)), True
    if kernel == "k_list":
        def lst() -> list[Tensor]:
            dtype, ndim = rng.choice(DTYPES), rng.randint(1, 3)
            return [t(dtype=dtype, ndim=ndim) for _ in range(rng.randint(1, 3))]
        return (lst(), lst(), _int(rng)), True
    if kernel == "k_6d":
        return (t(ndim=6, recipe=rng.choice(("contiguous", "permuted", "size1", "broadcast"))),
                t(ndim=rng.choice((5, 6)))), True
    raise AssertionError(kernel)


def _error_cases() -> list[Case]:
    """Arguments the dispatcher refuses: derive_signature must refuse them too."""
    x = Tensor((16, 16), "float32")
    return [
        Case("err-int32-overflow", "k_two", (x, x, 2**31), expect_error=True),
        Case("err-int64-overflow", "k_mixed", (x, x, 2**63, 1.0, True, 1), expect_error=True),
        Case("err-const-tensor", "k_const", (x, x, True, 1.0), expect_error=True),
        Case("err-const-str", "k_const", (x, "s", True, 1.0), expect_error=True),
        Case("err-empty-list", "k_list", ([], [x], 1), expect_error=True),
        Case("err-list-dtypes", "k_list", ([x, Tensor((16, 16), "float16")], [x], 1),
             expect_error=True),
        Case("err-list-ranks", "k_list", ([x, Tensor((16,), "float32")], [x], 1),
             expect_error=True),
        Case("err-static-rank", "k_static", (x, x, Tensor((), "float32")), expect_error=True),
        Case("err-none", "k_one", (None,), expect_error=True),
        Case("err-negative-static-stride", "k_stride_only",
             (Tensor((16, 16), "float32", (16, -1)), 3), expect_error=True),
        Case("err-stride-beyond-range", "k_one", (Tensor((2, 16), "float32", (2**61, 1)),),
             expect_error=True),
        Case("err-negative-stride-beyond-range", "k_one",
             (Tensor((2, 16), "float32", (-2**61 - 1, 1)),), expect_error=True),
    ]


def _fixed_cases() -> list[Case]:
    """Hand-picked cases that pinned a rule down (kept so they never regress)."""
    f16 = "float16"
    return [
        Case("fixed-fp16-4096", "k_one", (Tensor((4096, 4096), f16),)),
        Case("fixed-size1-stride0", "k_one", (Tensor((16, 1), "float32", (1, 0)),)),
        Case("fixed-torch-col", "k_one", (Tensor((4, 1), "float32", (1, 1)),)),
        Case("fixed-6d-size1", "k_one", (Tensor((1, 2, 2, 2, 2, 16), "float32"),)),
        Case("fixed-6d-misaligned", "k_6d", (Tensor((2, 2, 2, 2, 2, 16), f16, align=2),
                                             Tensor((2, 2, 2, 2, 2, 16), f16))),
        Case("fixed-0d", "k_one", (Tensor((), "float32"),)),
        Case("fixed-zero-size", "k_one", (Tensor((0, 16), "float32"),)),
        Case("fixed-zero-size-mid-torch", "k_one", (Tensor((4, 0, 16), "float32"),)),
        Case("fixed-zero-size-mid-cai", "k_one", (Tensor((4, 0, 16), "float32", (0, 16, 1)),)),
        Case("fixed-zero-size-both-cai", "k_two", (Tensor((0, 3), "float32", (0, 1)),
                                                  Tensor((3, 0, 2), "float32", (0, 2, 1)), 1)),
        Case("fixed-stride-near-range", "k_one", (Tensor((2, 16), "float32", (2**61 - 1, 1)),),
             torch_ok=False),
        Case("fixed-negative-stride-static-kernel", "k_stride_only",
             (Tensor((16, 16), "float32", (-16, 1)), 3), torch_ok=False),
        Case("fixed-empty-tuple", "k_tuple", (Tensor((16,), "float32"), ())),
        Case("fixed-const-tuple", "k_leaf_on_tuple", ((1,), (Tensor((16,), f16),), (1, (2.0, True)))),
        Case("fixed-static-size1", "k_static", (Tensor((16, 1, 4), f16), Tensor((1, 8), f16),
                                                Tensor((1, 16), f16))),
        Case("fixed-stride-only", "k_stride_only", (Tensor((16, 16), "float32", (1, 16)), 3)),
        Case("fixed-list-size1", "k_list", ([Tensor((1, 16), f16)], [Tensor((16, 16), f16)], 1)),
        Case("fixed-int64-big", "k_mixed", (Tensor((16,), f16), Tensor((16,), f16), 2**40, 1.0,
                                            False, 2**40)),
    ]


def generate_cases(n: int = 240, seed: int = 20250) -> list[Case]:
    """``n`` random cases (seeded) plus the fixed and error cases."""
    rng = random.Random(seed)
    names = list(KERNELS)
    weights = {"k_one": 4, "k_two": 3, "k_three": 2, "k_mixed": 2, "k_static": 2, "k_6d": 2,
               "k_list": 2}
    population = [k for k in names for _ in range(weights.get(k, 1))]
    cases = []
    for i in range(n):
        kernel = rng.choice(population)
        args, torch_ok = _args(rng, kernel)
        torch_ok = torch_ok and not any(_torch_cannot(a) for a in args)
        cases.append(Case(f"r{i:03d}-{kernel}", kernel, args, torch_ok))
    return _fixed_cases() + cases + _error_cases()


def _torch_cannot(arg: Any) -> bool:
    """Whether torch cannot build the tensor(s) as a view of a small allocation (a negative
    stride, or a span beyond `MAX_NUMEL_SPAN`)."""
    if isinstance(arg, Tensor):
        strides = arg.strides or ()
        span = sum((n - 1) * s for n, s in zip(arg.shape, strides)) if all(arg.shape) else 0
        return any(s < 0 for s in strides) or span >= MAX_NUMEL_SPAN
    if isinstance(arg, (list, tuple)):
        return any(_torch_cannot(a) for a in arg)
    return False


def runtime_args(args: tuple[Any, ...], make_array: Callable[[Tensor, int], Any]) -> tuple:
    """The arguments as a launch sees them: arrays from ``make_array(spec, slot)`` (one slot
    per tensor, in order), `Scalar` specs as their Python value, containers kept."""
    slot = iter(range(1 << 30))

    def conv(a: Any) -> Any:
        if isinstance(a, Tensor):
            return make_array(a, next(slot))
        if isinstance(a, Scalar):
            return a.value()
        if isinstance(a, list):
            return [conv(x) for x in a]
        if isinstance(a, tuple):
            return tuple(conv(x) for x in a)
        return a
    return tuple(conv(a) for a in args)


def cai_implicit_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Strides the dispatcher assumes for a CAI array given without strides: plain products
    (a size-0 dim zeroes the strides before it, where torch would count it as 1)."""
    strides, acc = [], 1
    for dim in reversed(shape):
        strides.append(acc)
        acc *= dim
    return tuple(reversed(strides))


def cai_implicit_ok(shape: tuple[int, ...]) -> bool:
    """Whether the dispatcher accepts an ``__cuda_array_interface__`` array of this shape
    without strides: it computes them row-major in int32 ("stride is too big" beyond)."""
    return max(cai_implicit_strides(shape), default=0) <= 2**31 - 1


def fake_pointer(spec: Tensor, slot: int) -> int:
    """A device address whose alignment is exactly ``spec.align`` (a power of two < 1 MiB)."""
    base = 0x7F00_0000_0000 + slot * (1 << 24)
    return base + (spec.align if spec.align < (1 << 20) else 0)


class FakeCudaArray:
    """An object that exposes ``__cuda_array_interface__`` v3 for a spec (no memory behind it)."""

    def __init__(self, spec: Tensor, ptr: int, explicit_strides: bool = True):
        itemsize = DTYPE_BITS[spec.dtype] // 8
        strides = tuple(s * itemsize for s in spec.strides or ())
        self.__cuda_array_interface__ = {
            "version": 3, "shape": spec.shape, "typestr": TYPESTR[spec.dtype],
            "strides": strides if explicit_strides else None, "data": (ptr, False),
        }

    def __repr__(self) -> str:
        return f"FakeCudaArray({self.__cuda_array_interface__})"
