"""Real arguments for a workload spec (tuning on a GPU).

`make_inputs` turns a declared workload (``Tensor``/``Scalar`` specs) into CUDA tensors with
random data, honouring strides and base-address alignment so that the launch signature -- and so
the compile key -- is the one the build planned. Where values matter (indices, masks, lengths),
a kernel may carry an ``inputs`` hook: ``tuned.inputs = fn`` with ``fn(w_spec, device) ->
mapping`` of the call arguments it wants to choose (the others stay random). The hook is read
with ``getattr(tuned, "inputs", None)``; no declaration change is needed.

The other way, specs of real arguments (online tuning), is `ctbuild.serve.live_args.call_spec`:
one derivation for the runtime and the tuner.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

from ..specs import DTYPE_BITS, Scalar, Tensor, Workload, dtype_name

if TYPE_CHECKING:
    from ..declare import TunedKernel

#: torch dtype attribute per cuTile dtype name.
_TORCH_DTYPES = {"bool": "bool", "uint8": "uint8", "int8": "int8", "uint16": "uint16",
                 "int16": "int16", "uint32": "uint32", "int32": "int32", "uint64": "uint64",
                 "int64": "int64", "float16": "float16", "bfloat16": "bfloat16",
                 "float32": "float32", "float64": "float64",
                 "float8_e4m3fn": "float8_e4m3fn", "float8_e5m2": "float8_e5m2"}


def is_spec(value: Any) -> bool:
    return isinstance(value, (Tensor, Scalar)) or (
        isinstance(value, (tuple, list)) and any(is_spec(v) for v in value))


def has_specs(w: Mapping[str, Any]) -> bool:
    """Whether a workload holds specs (build-time) rather than real arguments (run time)."""
    return any(is_spec(v) for v in w.values())


def torch_dtype(name: str) -> Any:
    import torch
    return getattr(torch, _TORCH_DTYPES[dtype_name(name)])


def _alloc(spec: Tensor, device: Any, generator: Any) -> Any:
    """A tensor with the spec's shape/strides whose base pointer has exactly its alignment."""
    import torch
    dtype = torch_dtype(spec.dtype)
    item = DTYPE_BITS[spec.dtype] // 8
    assert spec.strides is not None
    span = 1 + sum((n - 1) * abs(s) for n, s in zip(spec.shape, spec.strides) if n > 0)
    if spec.numel() == 0:
        span = 0
    # A fresh CUDA allocation is 256-byte aligned; a smaller alignment is an offset view.
    offset_bytes = 0 if spec.align % 256 == 0 else spec.align
    if offset_bytes % item:
        raise ValueError(f"{spec!r}: align {spec.align} is not a multiple of the item size {item}")
    offset = offset_bytes // item
    flat = torch.empty(span + offset + 1, dtype=dtype, device=device)
    _fill(flat, spec.dtype, generator)
    return torch.as_strided(flat, spec.shape, spec.strides, offset)


def _fill(t: Any, dtype: str, generator: Any) -> None:
    import torch
    if dtype == "bool":
        t.copy_(torch.rand(t.shape, device=t.device, generator=generator) < 0.5)
    elif dtype.startswith(("float8",)):
        t.copy_(torch.randn(t.shape, device=t.device, generator=generator).to(t.dtype))
    elif dtype.startswith(("float", "bfloat")):
        t.copy_(torch.randn(t.shape, device=t.device, generator=generator, dtype=torch.float32))
    else:
        # Small non-negative integers: safe as indices into anything of size >= 8.
        t.copy_(torch.randint(0, 8, t.shape, device=t.device, generator=generator))


def make_inputs(tuned: TunedKernel, w: Mapping[str, Any], device: Any = "cuda", seed: int = 0
                ) -> Workload:
    """Real call arguments for a workload spec: random data unless ``tuned.inputs`` decides."""
    import torch
    generator = torch.Generator(device=device)
    generator.manual_seed(seed)
    hook = getattr(tuned, "inputs", None)
    chosen: Mapping[str, Any] = {}
    if hook is not None:
        chosen = dict(hook(Workload(dict(w)), device) or {})
        unknown = set(chosen) - set(w)
        if unknown:
            raise ValueError(f"kernel {tuned.name!r}: inputs hook returned unknown argument(s) "
                             f"{sorted(unknown)}")

    def real(value: Any) -> Any:
        if isinstance(value, Tensor):
            return _alloc(value, device, generator)
        if isinstance(value, Scalar):
            return value.value()
        if isinstance(value, tuple):
            return tuple(real(v) for v in value)
        if isinstance(value, list):
            return [real(v) for v in value]
        return value

    return Workload({name: chosen[name] if name in chosen else real(value)
                     for name, value in w.items()})
