"""SampleMean: the exact mean over every sample of every batch, and usable outside inference mode after an
evaluation epoch reset it under that mode."""

from __future__ import annotations

import pickle

import torch

from project.toolkit.training import SampleMean


def test_every_sample_weighs_the_same_whatever_the_batch_sizes() -> None:
    mean = SampleMean()
    mean.update(torch.tensor([1.0, 2.0, 3.0]))
    mean.update(torch.tensor([10.0]))
    assert mean.compute().item() == (1 + 2 + 3 + 10) / 4


def test_hits_count_as_ones_and_zeros() -> None:
    mean = SampleMean()
    mean.update(torch.tensor([True, False, True, True]))
    assert mean.compute().item() == 0.75


def test_reset_under_inference_mode_leaves_it_usable_outside() -> None:
    # An evaluation epoch ends (and resets its metrics) under inference mode; the next updates may come
    # outside it, where torch refuses to update an inference tensor in place.
    mean = SampleMean()
    with torch.inference_mode():
        mean.update(torch.tensor([5.0]))
        mean.reset()
    mean.update(torch.tensor([1.0, 3.0]))
    assert mean.compute().item() == 2.0
    with torch.inference_mode():
        mean.update(torch.tensor([8.0]))
    assert mean.compute().item() == 4.0


def test_an_update_after_compute_makes_compute_count_it() -> None:
    # compute() keeps its result until an update marks it stale (SampleMean does that bookkeeping itself)
    mean = SampleMean()
    mean.update(torch.tensor([2.0]))
    assert mean.compute().item() == 2.0
    mean.update(torch.tensor([4.0]))
    assert mean.compute().item() == 3.0
    assert mean._update_count == 2


def test_a_copy_counts_its_own_updates() -> None:
    # the update's bookkeeping writes into one metric's dict: a clone or an unpickled copy (a spawned rank's)
    # must write into its own
    mean = SampleMean()
    mean.update(torch.tensor([2.0]))
    for copy in (mean.clone(), pickle.loads(pickle.dumps(mean))):
        copy.update(torch.tensor([4.0]))
        assert (mean._update_count, copy._update_count) == (1, 2)
        assert (mean.compute().item(), copy.compute().item()) == (2.0, 3.0)
