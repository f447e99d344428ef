"""On a GPU: CUBINs built on the CPU from anonymized TileIR launch warm and strict and compute
the right values, and a ``ct.Constant`` fed through ``args=`` selects its own CUBIN."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

sys.path.insert(0, str(Path(__file__).parents[1] / "fixtures" / "farm_project"))
from cli_helpers import explain, precompile  # noqa: E402

from ctbuild import runtime  # noqa: E402
from ctbuild.serve.miss_policy import CacheMissError  # noqa: E402
from ctbuild.serve.served_kernel import STATS  # noqa: E402

pytestmark = pytest.mark.gpu
FIXTURE = Path(__file__).parents[1] / "fixtures" / "identity_project"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cache = tmp_path_factory.mktemp("identity") / "cache"
    proc, _, _ = precompile("--config", str(FIXTURE / "ctbuild.toml"), "--cache", str(cache),
                            "--json")
    assert proc.returncode == 0, explain(proc)
    return cache


def test_warm_strict_launch_with_constants(built: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(FIXTURE))
    from idkernels.base import kern
    from idkernels.eps import add_eps
    runtime.reset()
    runtime.configure(cache_dir=built, mode="strict", disable_autotune=True)
    before = STATS.jit_compiles
    x = torch.randn(1024, device="cuda")
    out = torch.empty_like(x)
    kern(x, out)
    torch.cuda.synchronize()
    torch.testing.assert_close(out, 36 * x + 2)  # ((x*3*2*2)*3 + 1) + OFFSETS[0]
    rows = torch.randn(64, 256, device="cuda")
    got = torch.empty_like(rows)
    add_eps(rows, got, 1e-5)
    torch.cuda.synchronize()
    torch.testing.assert_close(got, rows + 1e-5)
    assert STATS.jit_compiles == before
    with pytest.raises(CacheMissError):  # another eps is another CUBIN: never the 1e-5 one
        add_eps(rows, got, 1e-6)
    runtime.reset()
