"""Consecutive blocks in stages of balanced cost: how ``pipeline`` splits a network, and how ``python -m project plan``
predicts it does (plain Python, so the plan reads it without torch)."""

from __future__ import annotations

import itertools


def balanced_starts(costs: list[float], num_stages: int) -> list[int]:
    """The first block of each stage after the first, minimising the largest stage's total cost."""
    n, prefix = len(costs), list(itertools.accumulate(costs, initial=0.0))
    # best[s][i]: the smallest largest-stage cost of the first i blocks in s stages; cut[s][i]: its last start
    best = [[float("inf")] * (n + 1) for _ in range(num_stages + 1)]
    cut = [[0] * (n + 1) for _ in range(num_stages + 1)]
    best[0][0] = 0.0
    for s in range(1, num_stages + 1):
        for i in range(s, n + 1):
            for j in range(s - 1, i):
                value = max(best[s - 1][j], prefix[i] - prefix[j])
                if value < best[s][i]:
                    best[s][i], cut[s][i] = value, j
    starts, i = [], n
    for s in range(num_stages, 1, -1):
        i = cut[s][i]
        starts.append(i)
    return starts[::-1]
