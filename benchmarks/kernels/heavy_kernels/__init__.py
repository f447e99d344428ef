"""Heavier real-world style kernels for the precompile benchmark (attention, matmul variants)."""
