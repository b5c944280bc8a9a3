"""Splitting a chain of blocks into consecutive stages of balanced cost: the pipeline strategy's default
split, and the plan's prediction of it. Plain Python, so ``python -m project plan`` needs no torch."""

from __future__ import annotations


def balanced_starts(costs: list[float], num_stages: int) -> list[int]:
    """The index of the first block of each stage after the first, for consecutive stages whose largest
    total cost is the smallest possible (dynamic programming over the split points).

    >>> balanced_starts([1, 1, 1, 1], 2), balanced_starts([3, 1, 1, 1], 2), balanced_starts([1, 2, 3, 4, 5], 3)
    ([2], [1], [3, 4])
    """
    n = len(costs)
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + c)
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
