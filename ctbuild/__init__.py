"""ctbuild: precompile and autotune cuTile kernels at build time; start warm at run time.

Declare next to the kernel::

    @ctbuild.autotune(space=Product(TM=[64, 128], TN=[64, 128]), grid=..., workloads=[...])
    @ct.kernel
    def matmul(A, B, C, TM: ct.Constant[int], TN: ct.Constant[int]): ...

then ``ctbuild precompile`` (CPU, container build), ``ctbuild tune`` (one GPU) and call
``matmul(a, b, c)`` at run time. Importing this package imports neither Ray nor the farm.
"""
from .arch import Arch
from .declare import DeclarationError, TunedKernel, autotune, registered
from .dims import Dim
from .keys import key, pow2
from .space import Config, Configs, Product, Zip
from .specs import Scalar, Tensor, Workload

__version__ = "0.1.0"
__all__ = ["Arch", "Config", "Dim", "Configs", "DeclarationError", "Product", "Scalar", "Tensor",
           "TunedKernel", "Workload", "Zip", "autotune", "key", "pow2", "registered"]
