"""Two example kernels as PyTorch ops, for model code run under ``torch.compile``:

- ``torch.ops.demo.silu_mul(x, y)`` allocates its output and returns it;
- ``torch.ops.demo.rmsnorm(x, w, out, eps)`` writes ``out`` in place and returns nothing.

A module of its own, which the model imports and ``ctbuild.toml`` does not list: it imports
torch, which ``ctbuild plan`` and the compile workers then need not import.
"""
import torch

import ctbuild
from demo_kernels.elementwise import silu_mul
from demo_kernels.rmsnorm import rmsnorm

silu_mul_op = ctbuild.torch_op(silu_mul, "demo::silu_mul",
                               outputs={"OUT": lambda w: torch.empty_like(w.X)})
rmsnorm_op = ctbuild.torch_op(rmsnorm, "demo::rmsnorm", mutates=("OUT",))
