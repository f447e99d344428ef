"""Call arguments that stand for a tuning record's workload without its memory.

A preload makes cuTile load each record's module before the first call (`ctbuild.cutile.
load_module`), which takes a launch with the signature the call will have: the record's
shapes, strides, dtypes and base-pointer alignment. Allocating its tensors would cost the GPU
memory of every tuned workload at once; a stand-in is a CUDA tensor of the spec's shape and
strides over one small real allocation (made through ``__cuda_array_interface__``, which takes
a pointer and a shape and checks no extent). Nothing reads or writes it: the load launches no
block, and a declaration's ``grid`` and ``args`` functions, which the build runs on specs that
hold no data, read only shapes, strides, dtypes and values.
"""
from __future__ import annotations

from typing import Any

from ..specs import Scalar, Tensor

#: The integer type of each item size: a stand-in is made as one, then viewed as its dtype
#: (the interface has no name for bfloat16 or the float8 types).
_INT_TYPESTR = {1: "|i1", 2: "<i2", 4: "<i4", 8: "<i8"}

#: Bytes of the real allocation every stand-in of a device points into (256-aligned, as a
#: fresh CUDA allocation is; a spec's smaller alignment is an offset into it).
BASE_BYTES = 512


class _Interface:
    """An object exposing a device pointer, shape and byte strides as a CUDA array."""

    def __init__(self, shape: tuple[int, ...], strides: tuple[int, ...], typestr: str,
                 pointer: int) -> None:
        self.__cuda_array_interface__ = {"shape": shape, "strides": strides,
                                         "typestr": typestr, "data": (pointer, False),
                                         "version": 3}


class StandIns:
    """Makes stand-ins on one CUDA device; keeps the allocation they point into."""

    def __init__(self, device: int) -> None:
        import torch
        self.torch = torch
        self.device = device
        self.base = torch.empty(BASE_BYTES, dtype=torch.uint8, device=f"cuda:{device}")

    def tensor(self, spec: Tensor) -> Any:
        """A CUDA tensor with ``spec``'s shape, strides, dtype and base-pointer alignment."""
        if spec.strides is None:
            raise ValueError(f"{spec!r} has symbolic sizes: no call has this layout")
        offset = spec.align % 256  # a power of two: the pointer is that aligned, no more
        array = self.torch.as_tensor(
            _Interface(spec.shape, tuple(s * spec.itemsize for s in spec.strides),
                       _INT_TYPESTR[spec.itemsize], self.base.data_ptr() + offset),
            device=f"cuda:{self.device}")
        return array.view(getattr(self.torch, spec.dtype))

    def args(self, values: tuple) -> tuple:
        """The call arguments standing for ``values`` (specs; lists and tuples element-wise;
        a `Scalar` its example value; anything else as given)."""
        return tuple(self._arg(v) for v in values)

    def _arg(self, value: Any) -> Any:
        if isinstance(value, Tensor):
            return self.tensor(value)
        if isinstance(value, Scalar):
            return value.value()
        if isinstance(value, (tuple, list)):
            return type(value)(self._arg(v) for v in value)
        return value
