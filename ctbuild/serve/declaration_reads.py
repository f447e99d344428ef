"""Which facts of the call's tensors a declaration's functions read, hence what the hot-path
key must hold (`KEY_LEVELS`).

The hot path keys a call by as little as it can afford to read per call. That is only sound
when nothing the call's entry holds depends on more: the declared ``key``/``default``/``grid``
/``args`` functions (the tuning key, the grid, the kernel arguments) and cuTile's launch
signature. The signature (which sees strides and pointer alignment) is guarded where the
launch happens: a served kernel is pinned to one signature (`served_kernel.LayoutChanged`).
This module covers the declared functions.

`DeclarationReads` runs them under a torch function mode that sees every tensor method and
property they touch. For pure functions -- the contract of a declaration -- a read set within
one level's facts means: two calls that agree on those facts get the same results.
"""
from __future__ import annotations

from typing import Any


class _NoMode:
    """Stands in for torch's function mode where torch is not installed: no torch tensor
    can be passed then, and other arrays are keyed by their full token anyway."""

    def __enter__(self) -> _NoMode:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


try:
    import torch
    from torch.overrides import TorchFunctionMode as _Mode
    _TensorBase: Any = torch._C.TensorBase
    _CLASSES: tuple = (_TensorBase, torch.Tensor)
except ImportError:
    _Mode, _TensorBase, _CLASSES = _NoMode, None, ()

#: What hot-path keys hold per tensor, weakest first (each level holds the ones before):
#: ``contiguity``: shape, dtype, ``is_contiguous()`` (and the device with several GPUs);
#: ``layout``: strides instead of contiguity; ``alignment``: + pointer % 16 (alignments
#: varied under one layout, or the signature cannot be derived to pin it); ``address``: + the
#: pointer (the declaration reads addresses, offsets, views or runs operations).
KEY_LEVELS = ("contiguity", "layout", "alignment", "address")

#: Tensor properties the weakest key covers.
SHAPE_PROPERTIES = frozenset({"shape", "dtype", "ndim", "device", "is_cuda", "itemsize",
                              "layout"})


def _methods(*names: str) -> frozenset:
    return frozenset(getattr(cls, n) for cls in _CLASSES for n in names if hasattr(cls, n))


#: Tensor methods whose results follow from the weakest key's facts.
SHAPE_METHODS = _methods("size", "is_contiguous", "dim", "ndimension", "numel", "nelement",
                         "element_size", "get_device", "__len__")

#: Tensor methods that read strides: they need ``layout`` keys.
STRIDE_METHODS = _methods("stride")


def level_of(func: Any) -> str:
    """The weakest key level that covers ``func`` (as a torch function mode sees it)."""
    if func in SHAPE_METHODS:
        return "contiguity"
    if func in STRIDE_METHODS:
        return "layout"
    if getattr(func, "__name__", None) == "__get__":
        prop = getattr(func, "__self__", None)
        if getattr(prop, "__objclass__", None) is _TensorBase and \
                getattr(prop, "__name__", None) in SHAPE_PROPERTIES:
            return "contiguity"
    return "address"


def _name(func: Any) -> str:
    if getattr(func, "__name__", None) == "__get__":
        return str(getattr(getattr(func, "__self__", None), "__name__", func))
    return str(getattr(func, "__name__", func))


class DeclarationReads(_Mode):
    """Context manager (reusable): after the ``with`` blocks, ``needs`` is the weakest key
    level covering every tensor read inside, and ``why`` names the read that set it."""

    def __init__(self) -> None:
        super().__init__()
        self.needs = KEY_LEVELS[0]
        self.why: str | None = None

    def __torch_function__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        level = level_of(func)
        if KEY_LEVELS.index(level) > KEY_LEVELS.index(self.needs):
            self.needs, self.why = level, _name(func)
        return func(*args, **(kwargs or {}))
