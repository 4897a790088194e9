"""CUDA-graph capture of a training step, shared by the torch tests of both operators (imported
inside CUDA-only tests: it needs torch)."""
from __future__ import annotations

import torch


def capture(step):
    """Run step() twice on a side stream (warm-up outside the capture), then capture one step()
    into a CUDA graph (step clears its leaves' grads first, so the captured backward allocates
    them in the graph's pool).  Returns (graph, what the captured step returned)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = step()
    return g, out
