"""Tune phase (one GPU): measure the precompiled candidates of each workload and record the winners.
Imported by the serve path only for CTBUILD_MODE=tune."""
