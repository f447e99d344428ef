"""The Ray precompile farm: compile jobs in, CUBINs out (into the cache, by the driver).

A generic executor: it knows nothing of cuTile or ctbuild. The caller gives it

* jobs: JSON-able dicts, each with a unique ``"key"`` (the compile key);
* ``compile_fn(job, *, timeout_sec) -> {"cubin": bytes, "symbol": str, "meta"?: dict, ...}``,
  a top-level function (Ray pickles it by reference; it is imported on the workers);
* the cache directory, which only the driver opens (`ctbuild.cache.Store.put_compile`);
* what the workers' environment must lose or gain (``strip_env``, ``env``), a setup hook, and
  an ``estimate(job)`` of each job's seconds for longest-first scheduling (and a ``learn(job,
  seconds)`` that refines it as jobs finish, and a ``running(job, elapsed)`` as they run).

Workers are long-lived Ray actors (one per worker slot, ``num_cpus=1, num_gpus=0``) that import
the caller's modules and run the setup hook once, then pull batches of jobs and send each CUBIN
back with its digest through Ray's object store. The driver checks, stores and re-reads every
CUBIN: workers need no cache path, no shared filesystem, and write only to their temp directory.
A failing job is recorded, never cached; a job whose worker dies is retried on another worker
(bounded); a job that hangs is cut off by the worker's own compiler timeout and, for a
Python-level hang, by the driver, which kills and replaces the worker. Imports neither the rest
of ctbuild nor any GPU code.

    from ctbuild.farm import Farm
    with Farm(cache_dir, "ctbuild.compile.compiler:compile_job", workers=8) as farm:
        result = farm.run(jobs)

The folder is the top-level farm/ of the source tree, imported only as ``ctbuild.farm``
(docs/architecture.md): a top-level ``farm`` is a project's own module.
"""
if __name__ != "ctbuild.farm":  # a source tree's root on sys.path: refuse a second copy
    raise ImportError(f"ctbuild's farm package is ctbuild.farm, not {__name__!r}")
from .executor import Farm, run_jobs
from .options import FarmOptions
from .records import FarmError, FarmResult, JobRecord

__all__ = ["Farm", "FarmError", "FarmOptions", "FarmResult", "JobRecord", "run_jobs"]
