"""Real call arguments (torch tensors, Python scalars) seen as the build sees them.

The build plans with `Tensor`/`Scalar` specs; at run time the same kernel gets real tensors.
This module turns real arguments into specs (`spec_of`: for miss records, for deriving the
compile key on the slow path, and for online tuning's keys) and into a cheap hashable *token*
per argument (for the hot-path memo).

A token covers everything a declaration's ``grid``/``args``/``key`` functions may read (shape,
strides, dtype, scalar values, constant values) plus what cuTile's launch signature depends on
beyond that (base pointer % 16, device). So equal tokens mean: same tuning key, same grid, same
kernel arguments apart from the tensors themselves, same CUBIN. The build calls those functions
on specs that hold no data, so they cannot depend on tensor contents or exact addresses.
"""
from __future__ import annotations

from typing import Any, Mapping

from ..specs import Scalar, Tensor, Workload, dtype_name

#: Largest base-pointer alignment a spec records (a fresh CUDA allocation is 256-aligned).
MAX_ALIGN = 256

try:  # torch is optional for key computation on specs; the GPU runtime needs it
    import torch as _torch
    _TorchTensor: Any = _torch.Tensor
except ImportError:  # pragma: no cover - torch is a runtime dependency of launching
    _torch = None

    class _TorchTensor:  # type: ignore[no-redef]
        """Placeholder: nothing is an instance without torch."""


def is_torch_tensor(value: Any) -> bool:
    """A torch tensor (what the hot path keys by its properties, and can guard)."""
    return isinstance(value, _TorchTensor)


def is_array(value: Any) -> bool:
    """A tensor-like argument (torch tensor, or anything with shape/dtype/stride())."""
    return isinstance(value, _TorchTensor) or (
        hasattr(value, "shape") and hasattr(value, "dtype") and callable(
            getattr(value, "stride", None)) and not isinstance(value, Tensor))


def data_ptr(value: Any) -> int:
    if hasattr(value, "data_ptr"):
        return int(value.data_ptr())
    iface = getattr(value, "__cuda_array_interface__", None)
    if iface is not None:
        return int(iface["data"][0])
    return 0


def align_of(ptr: int) -> int:
    """Largest power of two dividing ``ptr``, capped at 256 (0 counts as fully aligned)."""
    if ptr == 0:
        return MAX_ALIGN
    return min(ptr & -ptr, MAX_ALIGN)


def spec_of(value: Any, *, keep_scalars: bool = False) -> Any:
    """The build-time spec of one real argument: `Tensor` for arrays (shape, dtype, strides
    and the alignment of the base pointer), lists and tuples element-wise, a Python scalar a
    `Scalar` of its type -- or, with ``keep_scalars``, the scalar itself. Specs pass through.

    The one place a live argument becomes a spec: the runtime (miss records, the compile key of
    a call) and online tuning (`call_spec`) both go through it, so they cannot disagree on a
    tensor's spec; they differ only in what a scalar is, for the reasons given there."""
    if isinstance(value, (Tensor, Scalar)):
        return value
    if is_array(value):
        return Tensor(tuple(int(d) for d in value.shape), dtype_name(value.dtype),
                      tuple(int(s) for s in value.stride()), align_of(data_ptr(value)))
    if isinstance(value, tuple):
        return tuple(spec_of(v, keep_scalars=keep_scalars) for v in value)
    if isinstance(value, list):
        return [spec_of(v, keep_scalars=keep_scalars) for v in value]
    if keep_scalars:
        return value
    if isinstance(value, bool):
        return Scalar("bool", value)
    if isinstance(value, int):
        return Scalar("int32", value)
    if isinstance(value, float):
        return Scalar("float32", value)
    return value


def workload_spec(tuned: Any, w: Workload) -> Workload:
    """The call's workload as specs, the way `ctbuild precompile --from-record` will plan it.

    Arguments bound to ``ct.Constant`` parameters keep their value (it is in the key); other
    Python scalars become `Scalar` s (a runtime value: one CUBIN serves them all)."""
    consts = tuned.constant_args(w)
    return Workload({name: spec_of(v, keep_scalars=name in consts) for name, v in w.items()})


def call_spec(w: Mapping[str, Any]) -> Workload:
    """The call with its tensors as specs and its scalars as they are (online tuning).

    Online tuning keys its record with the declaration's ``key`` function on this, and the
    runtime looks the record up with the same function on the call itself: a key that reads a
    scalar's value sees that value in both (a `Scalar` would put its text in the key, and the
    record would never be found). The compile keys are the same either way: a Python scalar
    and the `Scalar` of its type give cuTile the same signature."""
    return Workload({name: spec_of(v, keep_scalars=True) for name, v in w.items()})


def device_of(value: Any) -> int | None:
    """CUDA device index of a tensor argument; -1 for a host tensor; None for a non-array."""
    if isinstance(value, _TorchTensor):
        return value.get_device()
    if is_array(value):
        iface = getattr(value, "__cuda_array_interface__", None)
        if iface is not None:
            return getattr(getattr(value, "device", None), "id", 0)
        return -1
    return None


def token(value: Any, _tensor: Any = _TorchTensor, _tuple: type = tuple, _list: type = list
          ) -> Any:
    """A hashable token of one argument for the hot-path memo (see the module docstring).

    Raises TypeError for an argument it cannot key (the call then takes the slow path)."""
    if isinstance(value, _tensor):
        return (value.shape, value.stride(), value.dtype, value.data_ptr() & 15,
                value.get_device())
    cls = type(value)
    if cls is _tuple or cls is _list:
        return (cls, _tuple(map(token, value)))
    if cls is int or cls is float or cls is bool or cls is str or value is None:
        return (cls, value)
    iface = getattr(value, "__cuda_array_interface__", None)
    if iface is not None:
        return (cls, _tuple(iface["shape"]), _tuple(iface.get("strides") or ()),
                iface["typestr"], iface["data"][0] & 15, device_of(value))
    raise TypeError(f"no fast key for {cls.__name__}")


#: The plain scalar types a hot-path key holds by type and value (each maps to itself: the
#: generated key's ``_PLAIN[type(a)]`` raises KeyError for any other type, a subclass too).
PLAIN = {int: int, float: float, bool: bool, str: str, type(None): type(None)}


def key_expression(args: tuple, with_device: bool = True, level: str = "alignment"
                   ) -> tuple[str, str, dict[str, Any]]:
    """(parameter names, key tuple expression, namespace it needs) of the hot path's memo key
    for calls with the kinds of these arguments; `make_key_fn` compiles it.

    The key is one flat tuple: for a tensor position what ``level`` names
    (`declaration_reads.KEY_LEVELS`: shape, dtype and ``is_contiguous()``; or shape, strides
    and dtype, then pointer % 16, then the pointer), and its device index when several GPUs are
    visible; for a plain scalar position its type and value; anything else its generic
    `token`. The weaker levels cost less: the runtime uses them while the declared functions
    read nothing more and a pinned served kernel guards the launch signature. Evaluating it
    raises (AttributeError, KeyError, TypeError) for arguments of other kinds: the caller then
    takes the slow path and builds a new key.
    """
    parts = []
    for i, value in enumerate(args):
        a = f"a{i}"
        if is_torch_tensor(value):
            parts.append({"contiguity": f"{a}.shape, {a}.dtype, {a}.is_contiguous()",
                          "layout": f"{a}.shape, {a}.stride(), {a}.dtype",
                          "alignment": f"{a}.shape, {a}.stride(), {a}.dtype, "
                                       f"{a}.data_ptr() & 15",
                          "address": f"{a}.shape, {a}.stride(), {a}.dtype, "
                                     f"{a}.data_ptr()"}[level]
                         + (f", {a}.get_device()" if with_device else ""))
        elif type(value) in PLAIN:
            parts.append(f"_PLAIN[type({a})], {a}")
        else:
            token(value)  # raises TypeError when it cannot be keyed at all
            parts.append(f"_token({a})")
    params = ", ".join(f"a{i}" for i in range(len(args)))
    expr = f"({', '.join(parts)}{',' if len(parts) == 1 else ''})"
    return params, expr, {"_PLAIN": PLAIN, "_token": token}


#: The key functions made so far, by source: kernels whose arguments are of the same kinds
#: share one (compiling it is ~0.1 ms of a kernel's first call). Bounded: then it starts over.
_KEY_FNS: dict[str, Any] = {}
_MAX_KEY_FNS = 256


def make_key_fn(args: tuple, with_device: bool = True, level: str = "alignment") -> Any:
    """``key(*args)``: the `key_expression` of calls with the kinds of these arguments, as a
    function: the Python form's key and the slow path's memo key."""
    params, expr, namespace = key_expression(args, with_device, level)
    source = f"def key({params}):\n    return {expr}\n"
    fn = _KEY_FNS.get(source)
    if fn is None:
        exec(compile(source, f"<ctbuild key for {len(args)} args>", "exec"), namespace)
        fn = namespace["key"]
        if len(_KEY_FNS) >= _MAX_KEY_FNS:
            _KEY_FNS.clear()
        _KEY_FNS[source] = fn
    return fn
