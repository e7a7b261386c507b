"""Device timing for ``gdnjit tune``: CUDA-graph replays of calls rotating over input sets."""

from __future__ import annotations

import math
import statistics
from typing import Callable


def time_graph_us(fn: Callable[[int], None], n_sets: int, calls: int = 10, replays: int = 7) -> float:
    """Median device microseconds per call: ``calls`` calls (raised to a multiple of ``n_sets``, so
    every input set is used once per replay and the working set exceeds L2 as the caller sized it)
    captured in one CUDA graph, cycling over the sets, replayed ``replays`` times."""
    import torch

    calls = n_sets * math.ceil(max(calls, n_sets) / n_sets)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i in range(min(3, calls)):  # warm-up outside capture (module load, allocator)
            fn(i % n_sets)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            fn(i % n_sets)
    graph.replay()
    torch.cuda.synchronize()
    times = []
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(replays):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0 / calls)
    del graph
    return statistics.median(times)
