"""Build and serve derive the same keys: for every example workload, and for randomly generated
layouts replayed the way ``--from-record`` does, the compile key the plan builds is the one
the runtime looks up, and the tuning-record key the tuner writes is the one it reads."""
from __future__ import annotations

import random

import pytest

torch = pytest.importorskip("torch")

from conftest import RUNTIME_TOOLCHAIN as TC  # noqa: E402
from gpu_runtime_examples import host_tensors, load_examples  # noqa: E402

from ctbuild import Arch, runtime  # noqa: E402
from ctbuild.compile.plan import make_plan  # noqa: E402
from ctbuild.keys import kernel_record_key  # noqa: E402
from ctbuild.serve.live_args import workload_spec  # noqa: E402
from ctbuild.specs import Workload, spec_from_json, spec_to_json  # noqa: E402

KERNELS = load_examples()
GPU = "NVIDIA H200"
CASES = [(name, i) for name, k in KERNELS.items() for i in range(len(k.workloads))]


def _plan_keys(tuned, workloads: list[Workload]) -> set[str]:
    plan = make_plan([tuned], [Arch("sm_90")], TC, extra_workloads={tuned.name: workloads})
    return set(plan.jobs)


@pytest.mark.parametrize("name,index", CASES)
def test_example_workloads(runtime_store, name: str, index: int) -> None:
    runtime.configure(store=runtime_store, mode="default")
    tuned = KERNELS[name]
    w = tuned.workloads[index]
    res = tuned.runtime.resolve(host_tensors(w, values=False), arch="sm_90", gpu=GPU)
    assert res.config_from == "default" and res.compile_key is not None
    assert res.compile_key in _plan_keys(tuned, [])
    assert res.record_key == kernel_record_key(tuned, w, "sm_90", GPU, TC)


def _random_view(rng: random.Random, shape: tuple[int, ...], dtype) -> torch.Tensor:
    """A view of a larger buffer: random offset (alignment), step and, in 2-D, transpose."""
    step = rng.choice([1, 1, 2, 3])
    offset = rng.choice([0, 0, 1, 8])
    if len(shape) == 2 and rng.random() < 0.3:
        return _random_view(rng, shape[::-1], dtype).t()
    big = torch.zeros((shape[0] * step + offset, *shape[1:]), dtype=dtype)
    return big[offset::step][: shape[0]]


@pytest.mark.parametrize("seed", range(6))
def test_random_layouts_replayed_from_records(runtime_store, seed: int) -> None:
    runtime.configure(store=runtime_store, mode="default")
    rng = random.Random(seed)
    dtype = rng.choice([torch.float16, torch.bfloat16, torch.float32])
    silu, matmul = KERNELS["silu_mul"], KERNELS["matmul"]
    n = rng.choice([1000, 4096, 1 << 16])
    m, k, p = (rng.choice([384, 1000, 1024, 2048]) for _ in range(3))
    calls = [(silu, [_random_view(rng, (n,), dtype) for _ in range(3)]),
             (matmul, [_random_view(rng, s, dtype) for s in ((m, k), (k, p), (m, p))])]
    for tuned, args in calls:
        res = tuned.runtime.resolve(tuple(args), arch="sm_90", gpu=GPU)
        recorded = workload_spec(tuned, tuned.bind(*args))  # what CTBUILD_RECORD writes
        replayed = Workload({n_: spec_from_json(spec_to_json(v)) for n_, v in recorded.items()})
        assert res.compile_key in _plan_keys(tuned, [replayed]), (tuned.name, replayed)
        assert res.record_key == kernel_record_key(tuned, replayed, "sm_90", GPU, TC)
