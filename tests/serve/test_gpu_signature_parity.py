"""Signature parity on a real GPU: `derive_signature` vs the dispatcher on real torch tensors.

Runs tests/gpu/parity_on_gpu.py's comparison in-process; skipped where torch or CUDA is missing
(the CPU parity test, test_signature_parity.py, covers the same cases on a stub libcuda).
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS / "gpu"))


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda_available(), reason="needs torch with a visible CUDA GPU")
def test_signature_parity_on_gpu() -> None:
    import parity_on_gpu

    passed, failed, failures = parity_on_gpu.run(limit=None, verbose=False)
    assert passed >= 100
    assert failed == 0, "\n".join(failures[:10])
