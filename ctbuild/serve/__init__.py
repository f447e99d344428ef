"""Serve phase: launch declared kernels warm from the cache (`kernel_runtime` is the hot path).
Imports neither ctbuild.compile, ctbuild.tune, Ray nor the farm."""
