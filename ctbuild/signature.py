"""Derive, on a CPU machine, the `KernelSignature` cuTile's dispatcher derives at launch time.

The runtime looks CUBINs up by the signature the C++ dispatcher computes from real tensors; the
build computes it from `Tensor` specs. If the two disagree by one field the CUBIN is never found,
so these rules mirror the dispatcher exactly. `tests/serve/test_signature_parity.py` checks them
against cuTile's own extension (running on a stub libcuda) for a few hundred generated cases, and
`tests/gpu/parity_on_gpu.py` against real CUDA tensors.

Rules of the cuTile 1.7.0 dispatcher (found by probing it; each one was a parity failure first):

- Calling convention: the launch path uses ``cutile_python_v2`` exactly when some argument needs
  it: a tuple anywhere (also empty or constant tuples) or a shape constant on some array (a size-1
  dim of an array of rank <= 5, a list element included, or any ``static_shape_dims``). A size-1
  dim of a 6-D array keeps v1, because above rank 5 nothing is inferred.
- ``may_alias_internally``: sort (stride, extent) pairs of *all* dims, size-1 dims included (a
  size-1 dim with stride 0 counts as aliasing); disjoint iff the smallest stride > 0 and each
  next stride >= previous stride * previous extent.
- Base alignment 16 (pointer % 16 == 0) is derived at every rank, 6-D included; only the
  stride/shape facts stop above rank 5.
- ``static_shape_dims`` / ``static_stride_dims`` (``ct.ArrayAnnotation``) are the *sole* source
  of shape / stride constants when given (no size-1 or unit-stride inference on the other dims),
  they apply at every rank, negative dims count from the end, out-of-range or duplicate dims are
  errors. A constant dim has divisibility 1 and no stride lower bound.
- ``stride_lower_bound_incl`` is 0 on every non-constant dim, even for a negative stride. A
  negative stride on a ``static_stride_dims`` dim is refused by the dispatcher (its lower bound
  would be below 0), so it is refused here, at plan time, not planned as a CUBIN that can never
  launch.
- Shapes and strides reach the dispatcher as C ``long`` (strides in bytes): a size beyond
  int64, or a stride whose byte size falls outside it, is refused (``OverflowError`` there,
  `SignatureError` here). A size-0 dim is an ordinary dim for every rule (an empty batch is a
  real call): its strides count as given, and 0 is divisible by 16.
- An ``__cuda_array_interface__`` array given without strides gets row-major strides computed
  in int32: one beyond int32 is refused there ("stride is too big"). Specs always carry their
  strides, so such an array must pass them explicitly (torch's DLPack export always does).
- Implicit strides: torch tensors reach the dispatcher through DLPack with torch's own strides
  (a size-0 dim counts as 1, so ``(4, 0, 16)`` has strides ``(16, 16, 1)``), and a `Tensor` spec
  without strides means exactly those. An ``__cuda_array_interface__`` array without strides gets
  plain products instead (``(0, 16, 1)``); specs of such arrays must give their strides.
- Leaf annotations reach into tuple values: ``ct.ScalarInt64`` on a tuple param makes its int
  items int64, ``ct.IndexedWithInt64`` its arrays int64, ``ct.Constant`` makes every item (nested
  tuples too) a constant. An ``ArrayAnnotation`` on a list param is ignored; a list's arrays take
  the element annotation of ``ct.ListAnnotation``.
- Scalars: bool -> bool_, int -> int32 (int64 with ``ct.ScalarInt64``; out of range is an error at
  launch), float -> float32 whatever the annotation. Constants: bool/int/float values (and tuples
  of them) only; 1, True and 1.0 are different constants.
- Lists of arrays: non-empty, one dtype and rank; the element constraint is the meet of the
  elements' constraints (min divisibility, equal constants only, aliasing if any element aliases)
  and ``elements_may_alias`` is always True.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any, Sequence

import cuda.tile as ct
from cuda.tile.compilation import (
    ArrayConstraint,
    CallingConvention,
    ConstantConstraint,
    KernelSignature,
    ListConstraint,
    ScalarConstraint,
    TupleConstraint,
)

from . import cutile
from .specs import DTYPE_BITS, Scalar, Tensor

#: Divisibility and unit-stride/size-1 facts are only derived for arrays of at most this rank.
MAX_SPECIALIZED_NDIM = 5
#: The dispatcher's base-address fact: it only ever claims 16-byte alignment (or nothing).
BASE_ALIGN = 16
_CT_DTYPES = {name: getattr(ct, "bool_" if name == "bool" else name) for name in DTYPE_BITS}
_INT32 = (-2**31, 2**31 - 1)
_INT64 = (-2**63, 2**63 - 1)


class SignatureError(ValueError):
    """A kernel argument cannot be turned into a signature (wrong kind for the parameter)."""


def _is_disjoint(shape: Sequence[int], strides: Sequence[int]) -> bool:
    """The dispatcher's test that distinct in-bounds indices never reach the same element.

    It sorts (stride, extent) over all dims, size-1 dims included, so a size-1 dim with stride 0
    makes an array "aliasing" although it is not; we copy that, since the flag is in the key.
    """
    dims = sorted(zip(strides, shape))
    if not dims:
        return True
    if dims[0][0] <= 0:
        return False
    for (prev_stride, prev_extent), (stride, _) in zip(dims, dims[1:]):
        if stride < prev_stride * prev_extent:
            return False
    return True


def _static_dims(dims: Sequence[int] | None, ndim: int, what: str) -> tuple[int, ...] | None:
    """Normalise ``static_*_dims`` like the dispatcher does (negative from the end), or fail.

    None when the annotation lists no dims: then the dispatcher infers constants itself.
    """
    if not dims:
        return None
    out: list[int] = []
    for d in dims:
        if not -ndim <= d < ndim:
            raise SignatureError(f"{what} contains axis {d} but array rank is {ndim}")
        d %= ndim
        if d in out:
            raise SignatureError(f"{what} contains duplicate axis {d}")
        out.append(d)
    return tuple(out)


def array_constraint(spec: Tensor, annotation: Any, calling_convention: CallingConvention
                     ) -> ArrayConstraint:
    """The dispatcher's `ArrayConstraint` for a tensor with this shape/strides/dtype/alignment.

    ``annotation`` is the parameter's ``ct.ArrayAnnotation`` (or None).
    """
    assert spec.strides is not None
    bits = DTYPE_BITS[spec.dtype]
    index_dtype = ct.int32
    static_shape = static_stride = None
    if annotation is not None:
        index_dtype = annotation.index_dtype or ct.int32
        static_shape = _static_dims(annotation.static_shape_dims, spec.ndim, "static_shape_dims")
        static_stride = _static_dims(annotation.static_stride_dims, spec.ndim,
                                     "static_stride_dims")
    _check_launchable(spec, max(bits // 8, 1), static_stride)
    specialize = spec.ndim <= MAX_SPECIALIZED_NDIM
    v2 = calling_convention.version >= 2
    if static_shape is not None and not v2:
        raise SignatureError("static_shape_dims need calling convention cutile_python_v2")
    dims = _dim_facts(spec, bits, static_shape, static_stride, specialize=specialize, v2=v2)
    return ArrayConstraint(
        _CT_DTYPES[spec.dtype], spec.ndim,
        index_dtype=index_dtype,
        stride_lower_bound_incl=dims.lower_bound,
        alias_groups=(),
        may_alias_internally=not _is_disjoint(spec.shape, spec.strides),
        stride_constant=dims.stride_constant,
        shape_constant=dims.shape_constant if v2 else None,
        stride_divisible_by=dims.stride_div,
        shape_divisible_by=dims.shape_div,
        base_addr_divisible_by=BASE_ALIGN if spec.align % BASE_ALIGN == 0 else 1,
    )


def _check_launchable(spec: Tensor, itemsize: int, static_stride: tuple[int, ...] | None
                      ) -> None:
    """Refuse, at plan time, what the dispatcher refuses at launch: a size or a byte stride
    beyond int64 (C ``long``), or a negative stride on a ``static_stride_dims`` dim."""
    assert spec.strides is not None
    for i, n in enumerate(spec.shape):
        if n > _INT64[1]:
            raise SignatureError(f"dim {i} has size {n}, beyond the int64 range cuTile's launch "
                                 "accepts")
    for i, st in enumerate(spec.strides):
        if not _INT64[0] <= st * itemsize <= _INT64[1]:
            raise SignatureError(f"stride {st} of dim {i} is {st * itemsize} bytes, beyond the "
                                 "int64 range cuTile's launch accepts")
        if static_stride is not None and i in static_stride and st < 0:
            raise SignatureError(f"dim {i} is in static_stride_dims but its stride is {st}: "
                                 "cuTile refuses a negative static stride at launch")


@dataclasses.dataclass
class _DimFacts:
    """The per-dim fields of an `ArrayConstraint`, one item per dim."""
    stride_constant: list[int | None] = dataclasses.field(default_factory=list)
    shape_constant: list[int | None] = dataclasses.field(default_factory=list)
    lower_bound: list[int | None] = dataclasses.field(default_factory=list)
    stride_div: list[int] = dataclasses.field(default_factory=list)
    shape_div: list[int] = dataclasses.field(default_factory=list)


def _dim_facts(spec: Tensor, bits: int, static_shape: tuple[int, ...] | None,
               static_stride: tuple[int, ...] | None, *, specialize: bool, v2: bool
               ) -> _DimFacts:
    """Each dim's constants, stride lower bound and divisibility as the dispatcher derives them:
    constants from the annotation's static dims alone when it gives them, else inferred (a unit
    stride; a size-1 dim under v2) up to rank 5; a constant dim has no other fact."""
    assert spec.strides is not None
    facts = _DimFacts()
    for i, (n, s) in enumerate(zip(spec.shape, spec.strides)):
        if static_stride is not None:
            sc = s if i in static_stride else None
        else:
            sc = 1 if specialize and s == 1 else None
        if static_shape is not None:
            nc = n if i in static_shape else None
        else:
            nc = 1 if specialize and v2 and n == 1 else None
        facts.stride_constant.append(sc)
        facts.shape_constant.append(nc)
        facts.lower_bound.append(None if sc is not None else 0)
        facts.stride_div.append(128 // bits if sc is None and specialize and (s * bits) % 128 == 0
                                else 1)
        facts.shape_div.append(16 if nc is None and specialize and n % 16 == 0 else 1)
    return facts


def _meet(values: Sequence[int | None]) -> int | None:
    """A constant that holds for every list element, or None."""
    return values[0] if all(v == values[0] for v in values) else None


def list_constraint(specs: Sequence[Any], annotation: Any, calling_convention: CallingConvention
                    ) -> ListConstraint:
    """The dispatcher's `ListConstraint` for a list of tensors: what holds for all of them."""
    if not specs:
        raise SignatureError("empty lists are not supported as kernel arguments")
    if not all(isinstance(s, Tensor) for s in specs):
        raise SignatureError("list arguments must hold tensors only")
    if len({s.dtype for s in specs}) > 1:
        raise SignatureError("arrays in a list argument vary in dtype")
    if len({s.ndim for s in specs}) > 1:
        raise SignatureError("arrays in a list argument vary in rank")
    each = [array_constraint(s, annotation, calling_convention) for s in specs]
    first = each[0]
    ndim = first.ndim
    dims = range(ndim)
    stride_constant = [_meet([c.stride_constant[i] for c in each]) for i in dims]
    shape_constant = [_meet([c.shape_constant[i] for c in each]) for i in dims]
    element = ArrayConstraint(
        first.dtype, ndim,
        index_dtype=first.index_dtype,
        stride_lower_bound_incl=[None if sc is not None else 0 for sc in stride_constant],
        alias_groups=(),
        may_alias_internally=any(c.may_alias_internally for c in each),
        stride_constant=stride_constant,
        shape_constant=shape_constant if calling_convention.version >= 2 else None,
        stride_divisible_by=[1 if stride_constant[i] is not None else
                             min(c.stride_divisible_by[i] for c in each) for i in dims],
        shape_divisible_by=[1 if shape_constant[i] is not None else
                            min(c.shape_divisible_by[i] for c in each) for i in dims],
        base_addr_divisible_by=min(c.base_addr_divisible_by for c in each),
    )
    return ListConstraint(element, alias_groups=(), elements_may_alias=True)


def _int_scalar(value: int | None, dtype: Any, name: str) -> ScalarConstraint:
    lo, hi = _INT64 if dtype == ct.int64 else _INT32
    if value is not None and not lo <= value <= hi:
        hint = "" if dtype == ct.int64 else " (annotate the parameter with ct.ScalarInt64)"
        raise SignatureError(f"parameter {name!r}: {value} does not fit {dtype.name}{hint}")
    return ScalarConstraint(dtype)


def _scalar_constraint(value: Any, annotation: Any, name: str) -> ScalarConstraint:
    """Python bool/int/float (or a `Scalar` spec) -> the dispatcher's scalar type.

    At run time only Python scalars reach the dispatcher (it rejects numpy scalars), so a
    `Scalar` spec stands for a Python value of its kind; a dtype the dispatcher can never
    produce (float64, int8, int64 without ``ct.ScalarInt64``) is a declaration error.
    """
    scalar_ann = getattr(annotation, "scalar", None)
    int_dtype = scalar_ann.dtype if scalar_ann is not None else ct.int32
    if isinstance(value, Scalar):
        if value.dtype == "bool":
            return ScalarConstraint(ct.bool_)
        if value.dtype == "float32":
            return ScalarConstraint(ct.float32)
        if value.dtype == "int32" or (value.dtype == "int64" and int_dtype == ct.int64):
            example = value.example if isinstance(value.example, int) else None
            return _int_scalar(example, int_dtype, name)
        raise SignatureError(
            f"parameter {name!r}: a Scalar({value.dtype!r}) cannot be launched: cuTile types a "
            "Python scalar as bool, int32 (int64 with ct.ScalarInt64) or float32")
    if isinstance(value, bool):
        return ScalarConstraint(ct.bool_)
    if isinstance(value, int):
        return _int_scalar(value, int_dtype, name)
    if isinstance(value, float):
        return ScalarConstraint(ct.float32)
    raise SignatureError(f"parameter {name!r}: unsupported argument {value!r}")


def _constant_constraint(value: Any, name: str) -> Any:
    if isinstance(value, tuple):
        return TupleConstraint([_constant_constraint(v, name) for v in value])
    if isinstance(value, (bool, int, float)):
        return ConstantConstraint(value)
    raise SignatureError(f"parameter {name!r} is ct.Constant: {value!r} is not a bool, int, "
                         "float or tuple of them")


def _constraint(value: Any, node: Any, name: str, cconv: CallingConvention) -> Any:
    if node is not None and getattr(node, "KIND", "leaf") != "leaf":
        if not isinstance(value, tuple):
            raise SignatureError(f"parameter {name!r} is annotated as a tuple, got {value!r}")
        items = node.items if node.KIND == "heterogeneous_tuple" else (node.each,) * len(value)
        if len(items) != len(value):
            raise SignatureError(f"parameter {name!r} expects {len(items)} items, got {len(value)}")
        return TupleConstraint([_constraint(v, n, name, cconv) for v, n in zip(value, items)])
    if getattr(node, "constant", False):
        return _constant_constraint(value, name)
    if isinstance(value, tuple):
        # A leaf annotation on a tuple parameter applies to each item (and nested tuples).
        return TupleConstraint([_constraint(v, node, name, cconv) for v in value])
    if isinstance(value, Tensor):
        return array_constraint(value, getattr(node, "array", None), cconv)
    if isinstance(value, list):
        list_ann = getattr(node, "list", None)
        return list_constraint(value, getattr(list_ann, "element", None), cconv)
    return _scalar_constraint(value, node, name)


def _needs_v2(constraint: Any) -> bool:
    """Whether the launch path would pick cutile_python_v2 for this (v2-derived) constraint."""
    if isinstance(constraint, TupleConstraint):
        return True
    if isinstance(constraint, ListConstraint):
        constraint = constraint.element
    if isinstance(constraint, ArrayConstraint):
        return any(c is not None for c in constraint.shape_constant)
    return False


def derive_signature(kernel: Any, kernel_args: Sequence[Any], mangled: bool = True
                     ) -> KernelSignature:
    """The signature cuTile would derive when launching with these args, with its mangled
    symbol unless ``mangled`` is False (mangling costs ~1 ms; keys and the runtime's identity
    of a signature need only `signature_text`).

    ``kernel_args`` hold `Tensor` specs (or lists/tuples of them), `Scalar` specs, Python
    scalars and constant values, in parameter order.
    """
    annotated = cutile.annotated_function(kernel)
    params = list(annotated.pysig.parameters)
    if len(kernel_args) != len(params):
        raise SignatureError(f"kernel {annotated.pyfunc.__name__!r} takes {len(params)} arguments "
                             f"({', '.join(params)}), got {len(kernel_args)}")
    nodes = annotated.parameter_annotations

    def constraints(cconv: CallingConvention) -> list[Any]:
        return [_constraint(v, n, p, cconv) for v, n, p in zip(kernel_args, nodes, params)]

    cconv = CallingConvention.cutile_python_v2()
    derived = constraints(cconv)
    if not any(_needs_v2(c) for c in derived):
        cconv = CallingConvention.cutile_python_v1()
        derived = constraints(cconv)
    signature = KernelSignature(derived, cconv)
    return signature.with_mangled_symbol(annotated.pyfunc.__name__) if mangled else signature


def signature_class(kernel: Any, kernel_args: Sequence[Any]) -> tuple | None:
    """A key that is equal for two argument lists only if `derive_signature` gives both the
    same signature: per tensor its dtype, rank, alignment class, aliasing flag and, per dim,
    what the constraint reads of a size or stride (1 or not, divisible by 16 or by 128 bits,
    within int64), not the value; per scalar its type and range; per constant its value.

    The sizes of one `Dim` bucket fall into a few such classes, so the runtime derives a
    signature once per class, not per size (`Resolver._cover`). None where a value is read
    exactly beyond this (an annotation's static dims) or is not a spec: derive it then."""
    annotated = cutile.annotated_function(kernel)
    nodes = annotated.parameter_annotations
    if len(kernel_args) != len(nodes):
        return None
    try:
        key = tuple(_class_of(v, n) for v, n in zip(kernel_args, nodes))
        hash(key)
    except Exception:  # _Unclassed, or a value a class cannot hold (unhashable, a Dim): derive
        return None
    return key


class _Unclassed(Exception):
    """A value `signature_class` cannot stand for by a class."""


def _constant_class(value: Any) -> Any:
    """A constant by type and value, item by item (``(1, 2)`` and ``(1.0, 2)`` are equal
    tuples but different constants)."""
    if isinstance(value, tuple):
        return (tuple, *(_constant_class(v) for v in value))
    return (type(value), value)


def _class_of(value: Any, node: Any) -> Any:
    """`signature_class` of one argument, following `_constraint`'s dispatch."""
    if node is not None and getattr(node, "KIND", "leaf") != "leaf":
        if not isinstance(value, tuple):
            raise _Unclassed
        items = node.items if node.KIND == "heterogeneous_tuple" else (node.each,) * len(value)
        if len(items) != len(value):
            raise _Unclassed
        return ("tuple", *(_class_of(v, n) for v, n in zip(value, items)))
    if getattr(node, "constant", False):
        return ("const", _constant_class(value))
    if isinstance(value, tuple):
        return ("tuple", *(_class_of(v, node) for v in value))
    if isinstance(value, Tensor):
        return _tensor_class(value, getattr(node, "array", None))
    if isinstance(value, list):
        ann = getattr(getattr(node, "list", None), "element", None)
        return ("list", *(_tensor_class(v, ann) if isinstance(v, Tensor) else _class_of(v, None)
                          for v in value))
    if type(value) is bool or type(value) is float:
        return (type(value),)
    if type(value) is int:
        return (int, _INT32[0] <= value <= _INT32[1], _INT64[0] <= value <= _INT64[1])
    if isinstance(value, Scalar):
        return ("scalar", value)
    raise _Unclassed


def _tensor_class(spec: Tensor, annotation: Any) -> tuple:
    """What `array_constraint` reads of a tensor spec, as classes of its sizes and strides."""
    if spec.strides is None or spec.dtype not in DTYPE_BITS or any(
            getattr(annotation, a, None) for a in ("static_shape_dims", "static_stride_dims")):
        raise _Unclassed
    bits = DTYPE_BITS[spec.dtype]
    item = max(bits // 8, 1)
    return (spec.dtype, getattr(annotation, "index_dtype", None), spec.align % BASE_ALIGN == 0,
            _is_disjoint(spec.shape, spec.strides),
            tuple((n == 1, n % 16 == 0, n <= _INT64[1]) for n in spec.shape),
            tuple((st == 1, (st * bits) % 128 == 0, _INT64[0] <= st * item <= _INT64[1])
                  for st in spec.strides))


def int_constants(signature: KernelSignature) -> list[int]:
    """The integer ``ct.Constant`` values of a signature, in parameter order (a tuple
    constant's items too: a tile shape passed as one)."""
    out: list[int] = []

    def visit(c: Any) -> None:
        if isinstance(c, ConstantConstraint) and type(c.value) is int:
            out.append(c.value)
        elif isinstance(c, TupleConstraint):
            for item in c.items:
                visit(item)

    for c in signature.parameters:
        visit(c)
    return out


def _canonical(obj: Any) -> Any:
    if isinstance(obj, ConstantConstraint):
        return {"const": type(obj.value).__name__, "value": repr(obj.value)}
    if hasattr(obj, "__dataclass_fields__"):
        return {"_": type(obj).__name__,
                **{k: _canonical(getattr(obj, k)) for k in obj.__dataclass_fields__}}
    if isinstance(obj, (tuple, list)):
        return [_canonical(x) for x in obj]
    if isinstance(obj, CallingConvention):
        return obj.code
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    return str(obj)  # DType


def signature_text(signature: KernelSignature) -> str:
    """A canonical, stable text of a signature: part of every compile key."""
    return json.dumps(_canonical(signature.with_symbol(None)), sort_keys=True,
                      separators=(",", ":"))
