"""A kernel body imported from one module and declared in another (a user wrapping TileGym's
kernels in their own module): the project finds it by the declaring module, and a build worker,
which imports a job's module, finds it there."""
from __future__ import annotations

from conftest import ROOT

from ctbuild.compile.compiler import find_kernel
from ctbuild.project import load_project

PROJECT = ROOT / "benchmarks" / "kernels" / "tune_dims.toml"


def test_a_kernel_declared_outside_its_bodys_module_is_found() -> None:
    kernels = {k.name: k for k in load_project(PROJECT).kernels()}
    assert set(kernels) == {"attention_dims", "gemm_dims"}
    k = kernels["attention_dims"]
    assert k.module == "heavy_kernels.dims" and k.pyfunc.__module__ == "heavy_kernels.attention"
    assert find_kernel("heavy_kernels.dims", "attention_dims") is k
