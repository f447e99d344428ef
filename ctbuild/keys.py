"""Cache keys: compile keys (what a CUBIN is), tuning keys (which workloads share a winner).

Compile key = kernel fingerprint + toolchain fingerprint + signature + resolved hints + opt
level + sm arch. Nothing path- or host-dependent goes in, so a build at /build serves /app.

`kernel_compile_key` and `kernel_record_key` are the one derivation of each key from a declared
kernel: the planner, the farm worker, the tuner and the runtime all call them, so what is built
and what is looked up cannot drift apart.
"""
from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Callable, Mapping

import xxhash

from .specs import Scalar, contiguous_strides, dtype_name

if TYPE_CHECKING:
    from .declare import TunedKernel
    from .space import Config
    from .specs import Workload

KEY_FORMAT = 1


def digest(obj: Any) -> str:
    """xxh3-128 of the canonical JSON of ``obj``."""
    return xxhash.xxh3_128_hexdigest(json.dumps(obj, sort_keys=True, separators=(",", ":"),
                                                default=str).encode())


def resolve_hints(hints_by_target: Mapping[str, Mapping[str, Any]], arch: str) -> dict[str, Any]:
    """The hint values tileiras sees for ``arch`` (ByTarget resolved, defaults filled in)."""
    resolved = dict(hints_by_target.get("default", {}))
    resolved.update(hints_by_target.get(arch, {}))
    return resolved


def compile_key(*, kernel_fp: str, toolchain_fp: str, signature: str, hints: Mapping[str, Any],
                arch: str) -> str:
    """The content key of one CUBIN. ``hints`` must already be resolved for ``arch``."""
    return digest({"v": KEY_FORMAT, "kernel": kernel_fp, "toolchain": toolchain_fp,
                   "signature": signature, "hints": dict(hints), "arch": arch})


def tuning_record_key(*, kernel_fp: str, tuning_key: Any, arch: str, gpu: str,
                      toolchain_fp: str) -> str:
    """Where the winner for one (kernel, tuning key, GPU, toolchain) is recorded."""
    return digest({"v": KEY_FORMAT, "kernel": kernel_fp, "key": tuning_key, "arch": arch,
                   "gpu": gpu, "toolchain": toolchain_fp})


def kernel_compile_key(tuned: TunedKernel, cfg: Config, signature: Any, arch: str, toolchain_fp: str,
                       text: str | None = None) -> str:
    """The compile key of one config of a declared kernel for a cuTile `KernelSignature`
    (``text``: its `signature_text`, where the caller has it: ~0.1 ms to make again)."""
    from .signature import signature_text
    return compile_key(kernel_fp=tuned.fingerprint, toolchain_fp=toolchain_fp,
                       signature=text if text is not None else signature_text(signature),
                       hints=tuned.resolved_hints(cfg, arch), arch=str(arch))


def kernel_record_key(tuned: TunedKernel, w: Workload, arch: str, gpu: str, toolchain_fp: str) -> str:
    """Where the winner of a declared kernel for workload ``w`` on one GPU is recorded."""
    return record_key_for(tuned, tuned.tuning_key(w), arch, gpu, toolchain_fp)


def record_key_for(tuned: TunedKernel, tuning_key: Any, arch: str, gpu: str, toolchain_fp: str) -> str:
    """`kernel_record_key` for a tuning key already computed by ``tuned.tuning_key`` (the
    runtime computes a call's key and its bucket's once and tries both)."""
    return tuning_record_key(kernel_fp=tuned.fingerprint, tuning_key=tuning_key,
                             arch=str(arch), gpu=gpu, toolchain_fp=toolchain_fp)


def pow2(n: int) -> int:
    """Round up to a power of two: ``key`` bucketing so that similar sizes share a winner."""
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


#: The argument types `_is_tensor` found to be tensors (a tensor type's ``shape``, ``dtype``
#: and ``stride`` are its class's, so one test per type holds for its instances). A key asks
#: per argument per call, and inside the runtime's `DeclarationReads` each attribute test of a
#: torch tensor is a torch function call (~1.5 us).
_TENSOR_TYPES: set[type] = set()
_MAX_TENSOR_TYPES = 64


def _is_tensor(value: Any) -> bool:
    if type(value) in _TENSOR_TYPES:
        return True
    found = hasattr(value, "shape") and hasattr(value, "dtype") and callable(
        getattr(value, "stride", None))
    if found and len(_TENSOR_TYPES) < _MAX_TENSOR_TYPES:
        _TENSOR_TYPES.add(type(value))
    return found


def _stride_pattern(shape: tuple[int, ...], strides: tuple[int, ...]) -> Any:
    return "C" if contiguous_strides(shape) == strides else list(strides)


def tensor_key(value: Any, bucket: Mapping[int, Callable[[int], int]] | None = None) -> list:
    """[shape (bucketed), dtype, stride pattern] of a tensor or `Tensor` spec.

    A contiguous tensor with no dim of size 0 or 1 is "C" without reading its strides (its
    strides cannot be other ones), so the runtime's hot path can key it by contiguity alone;
    with such a dim, ``is_contiguous()`` ignores strides that the pattern shows."""
    shape = tuple(int(d) for d in value.shape)
    shown = [bucket[i](d) if bucket and i in bucket else d for i, d in enumerate(shape)]
    contiguous = getattr(value, "is_contiguous", None)
    if 0 not in shape and 1 not in shape and contiguous is not None and contiguous():
        pattern: Any = "C"
    else:
        pattern = _stride_pattern(shape, tuple(int(s) for s in value.stride()))
    return [shown, dtype_name(value.dtype), pattern]


def key(bucket: Mapping[str, Mapping[int, Callable[[int], int]]] | None = None
        ) -> Callable[[Any], tuple]:
    """Build a tuning-key function: shapes + dtypes + stride patterns of every tensor argument.

    ``bucket={"A": {0: ctbuild.pow2}}`` rounds dim 0 of A up to a power of two so that similar
    shapes share one tuning record. Other arguments contribute their type only; the values of
    arguments bound to ``ct.Constant`` parameters are appended by the declaration, always.
    """
    bucket = dict(bucket or {})

    def tuning_key(w: Any) -> tuple:
        out: list[Any] = []
        for name, value in w.items():
            if _is_tensor(value):
                out.append(tensor_key(value, bucket.get(name)))
            elif isinstance(value, Scalar):
                out.append(type(value.value()).__name__)
            else:
                out.append(type(value).__name__)
        return tuple(out)

    tuning_key.__dict__["ctbuild_bucket"] = bucket  # checked against the arguments at declaration
    return tuning_key
