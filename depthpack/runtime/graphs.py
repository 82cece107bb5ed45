"""CUDA-graph capture and latency measurement: the one home of both for the Predictor, the package
loader and the benchmark.

capture(fn) warms fn on a side stream (compilation, cuBLAS handles and workspaces happen outside the
capture), then records one call into a graph; replaying it re-runs the same kernels on the same
buffers. Latency is summarized by percentile(), the nearest-rank percentile (the C++ runner uses the
same rule).
"""
from __future__ import annotations

import math
import statistics
import time
from typing import Callable

import torch


def capture(fn: Callable[[], object], pool=None, device=None, warmup: int = 2) -> tuple[torch.cuda.CUDAGraph, object]:
    """Warm fn on a side stream, then capture one call of it in a CUDA graph; returns (graph, its output)."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        out = fn()
    return graph, out


def percentile(xs: list[float], q: float) -> float:
    """Nearest-rank percentile: the smallest x with at least q of the values at or below it."""
    s = sorted(xs)
    if not s:
        return float("nan")
    return s[min(len(s) - 1, max(0, int(math.ceil(q * len(s))) - 1))]


def summarize(ms: list[float]) -> dict:
    return {"median_ms": statistics.median(ms), "p90_ms": percentile(ms, 0.9), "calls": len(ms)}


def time_calls(fn: Callable[[int], object], device: torch.device, n_sets: int = 1, seconds: float = 0.5,
               min_calls: int = 20, max_calls: int = 300, sync_each: bool = True) -> list[float]:
    """Milliseconds of each call of fn(i) (i rotates over n_sets input sets), about `seconds` of calls
    after 3 warm-up calls.

    sync_each=True (latency as a caller meets it): each call is followed by a device sync and timed on
    the host clock, so host work, copies and launch overhead count. sync_each=False (back-to-back
    throughput): CUDA events around each call, no sync between calls."""
    cuda = device.type == "cuda"

    def sync():
        if cuda:
            torch.cuda.synchronize(device)

    for i in range(3):
        fn(i % n_sets)
    sync()
    t0 = time.perf_counter()
    fn(0)
    sync()
    one = max(time.perf_counter() - t0, 1e-6)
    n = int(min(max_calls, max(min_calls, seconds / one)))
    if cuda and not sync_each:
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
        for i, (a, b) in enumerate(events):
            a.record()
            fn(i % n_sets)
            b.record()
        sync()
        return [a.elapsed_time(b) for a, b in events]
    times = []
    for i in range(n):
        t = time.perf_counter()
        fn(i % n_sets)
        sync()
        times.append((time.perf_counter() - t) * 1e3)
    return times
