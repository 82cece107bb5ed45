"""Benchmarks: the latency ladder (python -m depthpack.bench), the kernel profile."""
