"""Build phase (CPU, no GPU): plan kernels x workloads x archs into compile jobs and compile them
into the cache. Nothing under ctbuild.serve imports this package."""
