"""Real arguments for a workload spec (tuning on a GPU).

`make_inputs` turns a declared workload (``Tensor``/``Scalar`` specs) into tensors, honouring
strides and base-address alignment so that the launch signature -- and so the compile key -- is
the one the build planned. The values come from the kernel's ``inputs=`` where it declares them
(`ctbuild.declared_inputs`): a range, a function per argument, or one function for several. A
tensor a function builds is copied into a tensor of the spec's layout, so a function never has
to get strides or alignment right. Without ``inputs=``:

* floats are standard normal, bools a fair coin;
* integers are whole numbers from 1 to N - 1, N the smallest extent above 1 of the workload's
  other tensor arguments (else the tensor's own largest extent). Such a value indexes any dim
  of those tensors in bounds, and as a length it is never 0 and never longer than any of their
  dims: random integers must neither fault nor make the work vanish (a sequence length of 0).
  They are seldom realistic, so ``ctbuild plan`` names these arguments.

The other way, specs of real arguments (online tuning), is `ctbuild.serve.live_args.call_spec`:
one derivation for the runtime and the tuner.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Mapping

from ..declared_inputs import ValueRange, int_limits, is_integer
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


def _alloc(spec: Tensor, device: Any, fill: Callable[[Any], None]) -> Any:
    """A tensor with the spec's shape/strides whose base pointer has exactly its alignment;
    ``fill`` writes the whole buffer under it (gaps between strided rows included)."""
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
    fill(flat)
    return torch.as_strided(flat, spec.shape, spec.strides, offset)


def _random(dtype: str, rng: ValueRange | None, generator: Any) -> Callable[[Any], None]:
    """A fill of ``dtype`` values: from ``rng`` when given, else the defaults (module doc)."""
    import torch

    def fill(t: Any) -> None:
        if rng is not None and rng.integer:
            t.copy_(torch.randint(int(rng.lo), int(rng.hi) + 1, t.shape, device=t.device,
                                  generator=generator))
        elif rng is not None:
            u = torch.rand(t.shape, device=t.device, generator=generator, dtype=torch.float64)
            t.copy_(u * (rng.hi - rng.lo) + rng.lo)
        elif dtype == "bool":
            t.copy_(torch.rand(t.shape, device=t.device, generator=generator) < 0.5)
        else:
            t.copy_(torch.randn(t.shape, device=t.device, generator=generator,
                                dtype=torch.float32))
    return fill


def default_int_range(spec: Tensor, name: str, w: Mapping[str, Any]) -> ValueRange:
    """1..N-1 for the integer tensor ``spec`` (argument ``name``, or inside it), N the
    smallest extent above 1 of the workload's other tensors (else its own largest extent),
    within its dtype: in bounds as an index into any of their dims, never 0 as a length."""
    others = [d for other, v in w.items() if other != name for t in _tensors(v)
              for d in t.shape if d > 1]
    n = min(others) if others else max(spec.shape, default=2)
    return ValueRange(1, max(1, min(n - 1, int_limits(spec.dtype)[1])))


def _tensors(value: Any) -> list[Tensor]:
    if isinstance(value, Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensors(v)]
    return []


def _scalar(spec: Scalar, rng: ValueRange | None, generator: Any, device: Any) -> Any:
    import torch
    if rng is None:
        return spec.value()
    if rng.integer:
        return int(torch.randint(int(rng.lo), int(rng.hi) + 1, (1,), device=device,
                                 generator=generator).item())
    u = float(torch.rand(1, device=device, generator=generator, dtype=torch.float64).item())
    return rng.lo + u * (rng.hi - rng.lo)


def _built(tuned: TunedKernel, w: Workload, device: Any) -> dict[str, Any]:
    """The values ``inputs=`` functions build for this workload, by argument name."""
    declared = tuned.inputs
    built: dict[str, Any] = {}
    if declared.build is not None:
        value = declared.build(w, device)
        if not isinstance(value, Mapping):
            raise tuned.error(f"inputs= returned {type(value).__name__}, not a mapping of "
                              "argument name -> value")
        if unknown := sorted(set(value) - set(w)):
            raise tuned.error(f"inputs= returned unknown argument(s) {unknown}; arguments: "
                              f"{', '.join(w)}")
        built.update(value)
    for name, make in declared.makers.items():
        built[name] = make(w, device)
    return built


def _into(tuned: TunedKernel, name: str, t: Any, value: Any) -> Any:
    """A built value copied into the tensor of the spec's layout (same shape required)."""
    import torch
    src = torch.as_tensor(value, device=t.device)
    if tuple(src.shape) != tuple(t.shape):
        raise tuned.error(f"inputs= built {name!r} with shape {tuple(src.shape)}; the workload "
                          f"declares {tuple(t.shape)}")
    t.copy_(src)
    return t


def make_inputs(tuned: TunedKernel, w: Mapping[str, Any], device: Any = "cuda", seed: int = 0
                ) -> Workload:
    """Real call arguments for a workload spec: declared values (``inputs=``) or random ones
    by the module doc's rules, the same for the same ``seed``."""
    import torch
    generator = torch.Generator(device=device)
    generator.manual_seed(seed)
    spec_w = Workload(dict(w))
    built = _built(tuned, spec_w, device)
    ranges = tuned.inputs.ranges

    def tensor(name: str, spec: Tensor, rng: ValueRange | None) -> Any:
        if rng is None and is_integer(spec.dtype):
            rng = default_int_range(spec, name, spec_w)
        return _alloc(spec, device, _random(spec.dtype, rng, generator))

    def real(name: str, value: Any) -> Any:
        """An argument (or an element of a tuple argument ``name``) made real."""
        if isinstance(value, Tensor):
            return tensor(name, value, None)
        if isinstance(value, Scalar):
            return value.value()
        if isinstance(value, (tuple, list)):
            return type(value)(real(name, v) for v in value)
        return value

    def argument(name: str, value: Any) -> Any:
        if name in built:
            if isinstance(value, Tensor):
                return _into(tuned, name, tensor(name, value, None), built[name])
            return built[name]
        if name in ranges and isinstance(value, Tensor):
            return tensor(name, value, ranges[name])
        if name in ranges and isinstance(value, Scalar):
            return _scalar(value, ranges[name], generator, device)
        return real(name, value)

    return Workload({name: argument(name, value) for name, value in w.items()})
