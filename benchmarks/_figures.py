"""The figures the performance benchmarks read from their runs' clocks, and the ratios over sessions run in
rotated orders (:func:`benchmarks._common.run_sessions`); :mod:`benchmarks._common` re-exports them."""

from __future__ import annotations

import itertools
import statistics
from typing import Any

SIDES = ("plain", "lightning", "template")  # the sides of a comparison; each runs twice in a session


CLOCKS = ("wall", "cpu")


def on(clock: dict[str, Any], which: str) -> dict[str, Any]:
    """The stamps of one clock: ``wall`` (``perf_counter`` after waiting for the device) or ``cpu``
    (the process's CPU seconds, all its threads), in the same layout."""
    return clock["cpu"] if which == "cpu" else clock


def steady_epoch_wall(clock: dict[str, Any]) -> float:
    """Mean wall seconds of an epoch after the first: from its start to the next one's (or to the end
    of training) -- training, validation, checkpoint, epoch-end logging and everything between."""
    stamps = [*clock["epoch_starts"][1:], clock["train_end"]]
    return (stamps[-1] - stamps[0]) / (len(stamps) - 1)


def steady_step_cycle(clock: dict[str, Any]) -> float:
    """The median training step cycle (end of one batch to the end of the next) of the epochs after
    the first; an epoch's first batch, which follows the epoch-start work, is left out."""
    return statistics.median(b - a for ends in clock["train_batch_ends"][1:] for a, b in itertools.pairwise(ends))


def eval_step_cycle(clock: dict[str, Any], warmup: int) -> float:
    """The median evaluation step cycle after the first ``warmup`` batches."""
    ends = [end for _, end, _ in clock["eval_batches"][warmup:]]
    return statistics.median(b - a for a, b in itertools.pairwise(ends))


def eval_between(clock: dict[str, Any], warmup: int) -> float:
    """The median time between two evaluation batches (one's result to the next one's arrival on the
    device: loading, the loop's own work, the hooks) after ``warmup``."""
    batches = clock["eval_batches"][warmup:]
    return statistics.median(b[0] - a[1] for a, b in itertools.pairwise(batches))


def eval_latency(clock: dict[str, Any], warmup: int) -> float:
    """The median time of an evaluation batch (arrival on the device to result) after ``warmup``."""
    return statistics.median(end - start for start, end, _ in clock["eval_batches"][warmup:])


def epoch_throughput(epochs: list[dict[str, Any]], count: str = "samples") -> float:
    """Images per second over the epochs after the first (all of them if there is one), as ``timing.json``
    computes ``train_samples_per_second`` (each epoch from its start to its last step); ``count``: the key of
    an epoch's images."""
    steady = epochs[1:] or epochs
    return sum(e[count] for e in steady) / sum(e["seconds"] for e in steady)


def session_ratio(runs: dict[str, list[dict[str, float]]], key: str, side: str = "template") -> float:
    """A session's ratio of ``key`` (a speed) of ``side`` to the plain loop: the side's mean over its runs, over
    the plain loop's mean (each side's two runs lie symmetrically about the session's middle: a steady drift
    cancels)."""
    return statistics.fmean(r[key] for r in runs[side]) / statistics.fmean(r[key] for r in runs["plain"])


ROUND = len(SIDES)  # sessions in which each side runs once in each pair of places (benchmarks.paired.order)


def round_means(ratios: list[float]) -> list[float]:
    """The mean of each round of :data:`ROUND` sessions in a row (sessions run in rotated orders,
    :func:`run_sessions`): within a round each side runs once in each pair of places, so the mean cancels what
    the places cost. Sessions after the last whole round are left out, as they would tilt it; with no whole
    round, the mean of all is the one figure.

    >>> [round(m, 4) for m in round_means([0.96, 0.99, 0.99, 0.90, 1.0, 1.0, 0.97, 0.98, 0.99, 0.5])]
    [0.98, 0.9667, 0.98]
    >>> round_means([0.96, 0.98])
    [0.97]
    """
    whole = len(ratios) - len(ratios) % ROUND
    if not whole:
        return [statistics.fmean(ratios)]
    return [statistics.fmean(ratios[start : start + ROUND]) for start in range(0, whole, ROUND)]


def balanced(ratios: list[float]) -> float:
    """One ratio from sessions run in rotated orders: the median of their :func:`round_means`, so that one
    disturbed round does not move the figure.

    >>> balanced([0.96, 0.99, 0.99, 0.90, 1.0, 1.0, 0.97, 0.98, 0.99])  # round means 0.98, 0.9667, 0.98
    0.98
    >>> balanced([0.96, 0.99, 0.99, 0.50]), balanced([0.96, 0.98])  # the lone fourth left out; no whole round
    (0.98, 0.97)
    """
    return statistics.median(round_means(ratios))


def verdict(session_ratios: list[float], goal: float) -> str:
    """``goal >= G: met`` (or ``MISSED``) for the :func:`balanced` ratio of ``session_ratios``, and how many of
    their whole rounds reach the goal: rounds on both sides of it mean the machine's noise is as large as the
    distance to the goal, and another reading may give the other verdict.

    >>> verdict([0.97, 0.97, 0.99, 0.99, 0.99, 0.99, 0.96, 0.97, 0.97], 0.98)  # round means 0.9767, 0.99, 0.9667
    'goal >= 0.98: MISSED, 1 of 3 rounds at or over it'
    >>> verdict([0.99, 0.97], 0.98)
    'goal >= 0.98: met, no whole round of 3 sessions to say how firmly'
    """
    status = "met" if balanced(session_ratios) >= goal else "MISSED"
    if len(session_ratios) < ROUND:
        return f"goal >= {goal}: {status}, no whole round of {ROUND} sessions to say how firmly"
    rounds = round_means(session_ratios)
    return f"goal >= {goal}: {status}, {sum(mean >= goal for mean in rounds)} of {len(rounds)} rounds at or over it"


def ratios_by_clock(each: list[dict[str, float]], template: str) -> dict[str, Any]:
    """From the sessions' ratios (:func:`run_sessions`), per clock ``c``: ``c_ratio``, the template's (named
    ``template`` with ``{clock}`` for the clock) over its sessions (:func:`balanced`), ``c_session_ratios``,
    each session's, ``lightning_c_ratio``, Lightning's loop alone (named ``lightning_c``), likewise, and
    ``over_lightning_c_ratio``, the template's speed over that side's in each session, balanced likewise: the
    template's own cost, paired, where dividing the other two balanced ratios would mix both their spreads."""
    summary: dict[str, Any] = {}
    for c in CLOCKS:
        ratios = [ratio[template.format(clock=c)] for ratio in each]
        floors = [ratio[f"lightning_{c}"] for ratio in each]
        summary.update({f"{c}_ratio": balanced(ratios), f"{c}_session_ratios": ratios})
        summary[f"lightning_{c}_ratio"] = balanced(floors)
        summary[f"over_lightning_{c}_ratio"] = balanced([r / floor for r, floor in zip(ratios, floors, strict=True)])
    return summary
