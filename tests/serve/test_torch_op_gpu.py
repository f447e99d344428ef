"""Two ctbuild kernels as torch ops in a model on a real GPU (examples/demo_kernels/ops.py:
``demo::silu_mul`` returns a new tensor, ``demo::rmsnorm`` writes its ``out`` in place), served
warm in strict mode: ``torch.compile(fullgraph=True)`` gives one graph with no break and
matches eager, and ``mode="reduce-overhead"`` captures the launches in a CUDA graph whose
replays compute each new input's result with no host call of the kernels.

Needs a warm cache of the examples: ``CTBUILD_TEST_CACHE=DIR``, else one is built here (as
tests/serve/test_runtime_gpu.py does: a minute or two). Skipped without CUDA.
"""
from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from gpu_runtime_examples import load_examples, warm_examples_cache  # noqa: E402

from ctbuild import runtime  # noqa: E402

KERNELS = load_examples()  # puts examples/ on sys.path
import demo_kernels.ops  # noqa: E402, F401 - declares torch.ops.demo.silu_mul and .rmsnorm

pytestmark = pytest.mark.gpu
#: rmsnorm's bfloat16 workload; silu_mul's bfloat16 workload is ROWS * WIDTH long.
ROWS, WIDTH, EPS = 8192, 2048, 1e-6


@pytest.fixture(scope="module")
def warm_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return warm_examples_cache(lambda: tmp_path_factory.mktemp("warm"))


@pytest.fixture(autouse=True)
def strict(warm_cache: Path, monkeypatch: pytest.MonkeyPatch):
    """Served warm, strict: a launch the cache does not cover raises rather than compiles."""
    for var in ("CTBUILD_MODE", "CTBUILD_RECORD", "CTBUILD_DISABLE_AUTOTUNE", "CTBUILD_TOOLCHAIN"):
        monkeypatch.delenv(var, raising=False)
    runtime.reset()
    runtime.configure(cache_dir=warm_cache, mode="strict")
    torch._dynamo.reset()
    yield
    runtime.reset()


def model(x: Any, y: Any, w: Any) -> Any:
    h = torch.ops.demo.silu_mul(x, y).view(ROWS, WIDTH)
    out = torch.empty_like(h)
    torch.ops.demo.rmsnorm(h, w, out, EPS)
    return out * 2 + 1


def inputs(seed: int) -> tuple[Any, Any, Any]:
    g = torch.Generator(device="cuda").manual_seed(seed)
    x, y = (torch.randn(ROWS * WIDTH, device="cuda", generator=g, dtype=torch.bfloat16)
            for _ in "xy")
    return x, y, torch.randn(WIDTH, device="cuda", generator=g, dtype=torch.bfloat16)


def reference(x: Any, y: Any, w: Any) -> Any:
    h = (torch.nn.functional.silu(x.float()) * y.float()).to(torch.bfloat16)
    hf = h.view(ROWS, WIDTH).float()
    out = (hf * torch.rsqrt((hf * hf).mean(dim=1, keepdim=True) + EPS) * w.float())
    return out.to(torch.bfloat16).float() * 2 + 1


def close(got: Any, want: Any) -> None:
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=5e-2)


def launches() -> int:
    """Host calls of the two kernels so far (a CUDA graph's replay makes none)."""
    return sum(KERNELS[n].runtime.provenance()["launches"] for n in ("silu_mul", "rmsnorm"))


def test_eager_ops_compute_the_kernels_results() -> None:
    args = inputs(0)
    close(model(*args), reference(*args))


def test_a_compiled_model_is_one_graph_and_matches_eager() -> None:
    args = inputs(0)
    explained = torch._dynamo.explain(model)(*args)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons
    compiled = torch.compile(model, fullgraph=True)
    for seed in (0, 1):
        args = inputs(seed)
        close(compiled(*args), model(*args))


def test_reduce_overhead_replays_a_cuda_graph_of_the_ops() -> None:
    from torch._dynamo.utils import counters
    counters.clear()
    compiled = torch.compile(model, mode="reduce-overhead", fullgraph=True)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for seed in range(3):  # a warm-up run, the recording, a first replay
            args = inputs(seed)
            close(compiled(*args).clone(), reference(*args))
        before = launches()
        for seed in range(3, 6):
            args = inputs(seed)
            close(compiled(*args).clone(), reference(*args))
    assert launches() == before  # replays: the kernels ran inside the graph
    assert counters["inductor"]["cudagraph_skips"] == 0
    assert not [w for w in seen if "CUDA Graph is empty" in str(w.message)]
