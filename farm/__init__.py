"""The Ray precompile farm: compile jobs in, CUBINs out (into the cache, by the workers).

A generic executor: it knows nothing of cuTile or ctbuild. The caller gives it

* jobs: JSON-able dicts, each with a unique ``"key"`` (the compile key);
* ``compile_fn(job, *, timeout_sec) -> {"cubin": bytes, "symbol": str, ...}``, a top-level
  function (Ray pickles it by reference; it is imported on the workers);
* the cache directory the workers write into (`cache.Store.put_compile`).

Workers are long-lived Ray actors (one per worker slot, ``num_cpus=1, num_gpus=0``) that import
the caller's modules and probe the toolchain once, then pull batches of jobs. Only small records
(key, status, seconds, error) travel back to the driver. A failing job is recorded, never
cached; a job whose worker dies is retried on another worker (bounded); a job that hangs is
cut off by the worker's own compiler timeout and, for a Python-level hang, by the driver, which
kills and replaces the worker. Imports neither ctbuild nor any GPU code.

    from farm import Farm
    with Farm(cache_dir, "ctbuild.compiler:compile_job", workers=8) as farm:
        result = farm.run(jobs)
"""
from .executor import Farm, FarmOptions, run_jobs
from .records import FarmError, FarmResult, JobRecord
from .cluster import describe_cluster

__all__ = ["Farm", "FarmError", "FarmOptions", "FarmResult", "JobRecord", "describe_cluster",
           "run_jobs"]
