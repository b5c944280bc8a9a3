"""The examples that were doctests of project/toolkit/timing and project/tools/plan: same inputs, same results."""

from __future__ import annotations

import math
import time

import torch
from torch import nn

from project.toolkit.timing import anatomy


def test_anatomy_bookkeeping() -> None:
    assert anatomy.covered([(0.0, 2.0), (1.0, 3.0), (5.0, 6.0)], 1.5, 5.5) == 2.0
    parts = anatomy.split_step(anatomy.StepTimes(0.0, 1.0, 10.0, 3.0, 7.0, 7.0, 9.0), communication=[(6.0, 7.0)])
    names = ("data_wait", "forward", "backward", "compute", "communication", "optimizer", "rest")
    assert [parts[k] for k in names] == [1.0, 2.0, 3.0, 5.0, 1.0, 2.0, 1.0]
    window = anatomy.summarise_window([{"compute": 2.0, "rest": 1.0}, {"compute": 4.0, "rest": 1.0}], 4.0)
    assert [window[k] for k in ("compute", "parts_sum_seconds", "step_seconds", "bubble")] == [3.0, 4.0, 4.0, None]
    assert anatomy.unaccounted({"step_seconds": 2.0, "parts_sum_seconds": 1.9}) == 0.05
    rank = {"step_seconds": 0.5, "data_wait": 0.05, "compute": 0.4, "communication": 0.0, "optimizer": 0.04}
    line = anatomy.format_line({"steps": 5, "ranks": [{**rank, "bubble": None, "rest": 0.01}]})
    assert line == "rank0 0.500 s = data 10 % + compute 80 % + comm 0 % + optim 8 % + rest 2 % (5 steps)"


def test_clocks_and_tensor_bytes() -> None:
    from project.toolkit.helpers import tensor_bytes
    from project.toolkit.timing.clocks import HostClock, device_clock

    clock = HostClock()
    start = clock.mark()
    end = clock.mark()
    clock.wait()
    assert clock.seconds(start, end) >= 0
    assert type(device_clock(torch.device("cpu"))).__name__ == "HostClock"
    assert type(device_clock(torch.device("cpu"), True)).__name__ == "SyncingClock"
    assert tensor_bytes({"a": torch.zeros(4), "b": [torch.zeros(2, dtype=torch.float64), 3]}) == 32


def test_environment_records() -> None:
    from project.toolkit.timing.environment import machine_description, run_environment

    assert "torch" in machine_description()
    assert sorted(run_environment())[:4] == ["cpu_cores", "cpu_model", "cuda", "cudnn"]


def test_flops_and_peaks() -> None:
    from project.toolkit.timing import flops, peaks

    net = nn.Sequential(nn.Flatten(), nn.Linear(3 * 2 * 2, 5))
    assert flops.model_flops_per_sample(net, image_size=2) == {"train": 240, "inference": 120}
    columns = [peaks.precision_column(p, t) for p, t in (("32-true", True), ("bf16-mixed", False), ("64-true", True))]
    assert columns == ["tf32", "bf16", None]
    assert flops.mfu(395.76, 989.4) == 0.4
    assert flops.mfu(None, 989.4) is None and flops.mfu(100.0, None) is None and flops.mfu(100.0, 0.0) is None


def test_measured_batches_leave_out_each_later_sizes_first_batch() -> None:
    from project.toolkit.timing.records import measured_batches

    assert measured_batches([256, 256, 256, 16]) == [0, 1, 2]
    assert measured_batches([1, 1]) == [0, 1]
    assert measured_batches([256, 16, 16]) == [0, 2]


def test_statistics() -> None:
    from project.toolkit.timing.records import after_warmup, clean, describe, nanmax

    described = {k: round(v, 3) for k, v in describe([1.0, 2.0, 3.0, 4.0]).items()}
    assert described == {"mean": 2.5, "std": 1.291, "p50": 2.5, "p90": 3.7, "p99": 3.97}
    assert (after_warmup([9.0, 1.0, 2.0], 1), after_warmup([9.0], 3)) == ([1.0, 2.0], [9.0])
    assert nanmax([1.0, float("nan"), 3.0]) == 3.0 and math.isnan(nanmax([float("nan")]))
    assert (clean(float("nan")), clean(1.23456789, 3)) == (None, 1.235)


def test_tables() -> None:
    from project.toolkit.helpers import human_bytes
    from project.toolkit.timing.tables import markdown_table, mean_std, number, text_table

    numbers = number(1.23456, 2, " s"), number(None), number(float("nan"), missing="–"), number(0.257, 1, scale=100)
    assert numbers == ("1.23 s", "n/a", "–", "25.7")
    assert (mean_std(2.0, 0.25, 2, " s"), mean_std(2.0, None, 1)) == ("2.00 s ± 0.25 s", "2.0")
    assert markdown_table(["a", "b"], [["1", "2"]]) == "| a | b |\n|---|---|\n| 1 | 2 |"
    assert text_table(["name", "s"], [["ddp", "1.5"]]) == "name  s\n----  ---\nddp   1.5"
    assert [human_bytes(n) for n in (2_400_000_000_000, 31_457_280, 900)] == ["2.4 TB", "31.5 MB", "900 B"]


def test_step_profile_line() -> None:
    from project.toolkit.timing.step_profile import one_line

    busy = {"step_seconds": 0.0241, "device_idle_fraction": 0.38, "launches": 450.0, "host_syncs": 2.0}
    assert one_line(busy) == "step 24.1 ms: device busy 62 % (idle 38 %), 450 launches, 2.0 host syncs"
    host = {"step_seconds": 0.01, "device_idle_fraction": None, "launches": 0.0, "host_syncs": 1.0}
    assert one_line(host) == "step 10.0 ms: no device timeline, 1.0 host syncs"


def test_summaries() -> None:
    from project.toolkit.timing import records as summary
    from project.toolkit.timing.records import EpochRecord
    from project.toolkit.timing.table import work_text

    mine = EpochRecord(1.0, 8, 0.1, 0.0)
    assert summary.gather_records(mine, [(-1, 900.0)], 1, None, torch.device("cpu"), 1) == [(mine, [(-1, 900.0)])]
    assert repr(mine) == "EpochRecord(seconds=1.0, samples=8, data_wait_seconds=0.1, val_seconds=0.0)"
    assert summary.memory_entries([[(0, 900.0), (1, 300.0)], [(1, 850.0)]], "cuda") == (
        ["rank0_cuda0", "rank0_cuda1", "rank1_cuda1"],
        [900.0, 300.0, 850.0],
    )
    records = [EpochRecord(2.0, 100, 0.2, 0.5), EpochRecord(2.5, 100, 0.1, 0.4)]
    assert summary.summarise_epoch(3, records)["samples_per_second"] == 80.0
    assert summary.summarise_epoch(3, records, 2)["samples_per_second"] == 40.0
    works = work_text(12.345, 0.41), work_text(0.00512, None), work_text(None, None)
    assert works == ("12.3 TFLOP/s (MFU 41.0 %)", "5.12 GFLOP/s", "n/a")


def test_balanced_starts() -> None:
    from project.toolkit.strategies.balance import balanced_starts

    assert balanced_starts([1, 1, 1, 1], 2) == [2]
    assert balanced_starts([3, 1, 1, 1], 2) == [1]
    assert balanced_starts([1, 2, 3, 4, 5], 3) == [3, 4]


def test_block_seconds_of_a_small_net() -> None:
    from project.tools.plan.block_times import block_seconds

    net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    times = block_seconds(list(net), torch.randn(8, 4), lambda x: x, clock=time.perf_counter)
    assert times["batch_sizes"] == [8, 2] and [len(t) for t in times["forward"]] == [3, 3]
    assert all(t > 0 for t in times["backward"][0])


def test_plan_formulas() -> None:
    from project.tools.plan import formulas as f
    from project.tools.plan.inputs import Link

    assert f.ring_all_reduce_seconds(100e6, 4, Link(0.0, 1e9, "given")) == 0.15
    assert f.all_gather_seconds(100e6, 4, Link(0.0, 1e9, "given")) == 0.075
    assert f.broadcast_seconds(1e6, 8, Link(1e-5, 1e9, "given")) == 0.00103
    assert [b / f.MIB for b in f.ddp_buckets(60 * f.MIB)] == [1.0, 25.0, 25.0, 9.0]
    link = Link(0.0, 1e9, "given")
    assert round(f.ddp_exposed_seconds([50e6, 50e6], backward=0.1, world=2, link=link), 6) == 0.05  # 0.05 s each
    assert round(f.ddp_exposed_seconds([50e6, 50e6], backward=1.0, world=2, link=link), 6) == 0.05  # the last shows
    assert f.balanced_stages([1, 1, 1, 1], 2) == [[0, 1], [2, 3]]
    assert f.balanced_stages([3, 1, 1, 1], 2) == [[0], [1, 2, 3]]
    times = {"batch_sizes": [32, 8], "forward": [[0.40], [0.16]], "backward": [[0.8], [0.8]]}
    assert round(f.unit_seconds(times, "forward", 0, 16), 3) == 0.24
    assert round(f.unit_seconds(times, "backward", 0, 4), 3) == 0.8
    assert (f.gpipe_step_seconds([1, 1], [2, 2], 4, 0.0), f.gpipe_step_seconds([1, 3], [2, 6], 4, 0.0)) == (15.0, 39.0)
    assert f.gpipe_shared_seconds([1, 1], [2, 2], 2, 0.0, 1.0) == (9.0, [6.0, 6.0])
    # both stages compute 4 of the 12 s at half speed
    assert f.gpipe_shared_seconds([1, 1], [2, 2], 2, 0.0, 2.0) == (12.0, [9.0, 9.0])


def test_how_much_slower_each_device_computes() -> None:
    from project.tools.plan import Measured, core_slowdown, link_from, threads_per_process

    run = Measured("cpu", 1, 32, 0, 0, 0, 0, 0, 1, 0, 0, 0, None, threads=2, cores=2)
    one_thread = Measured(**{**run.__dict__, "threads": 1})
    # 2 threads on 2 cores, then 1 each: twice as slow; a run of 1 thread already ran as each process will
    assert (core_slowdown(run, "auto", 2), core_slowdown(one_thread, "auto", 2)) == (2.0, 1.0)
    assert (core_slowdown(run, "yes", 2, nodes=2), core_slowdown(run, "no", 2)) == (4.0, 1.0)
    assert core_slowdown(run, "auto", 2, nodes=2) == 1.0  # a node each: cores of their own
    assert core_slowdown(Measured(**{**run.__dict__, "accelerator": "cuda"}), "auto", 2) == 1.0
    assert core_slowdown(Measured(**{**run.__dict__, "threads": None}), "auto", 3) == 3.0  # unknown: N x
    assert threads_per_process(Measured("cpu", 1, 32, 0, 0, 0, 0, 0, 1, 0, 0, 0, None, cores=16), 4) == 4
    link = link_from(8.0, 20.0)  # given: nothing measured
    assert (link.bandwidth, round(link.latency * 1e6, 9), link.source) == (1e9, 20.0, "given: 8 Gbit/s")


def test_fit_ring_and_network_profile() -> None:
    from project.toolkit.timing.network import network_profile
    from project.tools.plan.link import fit_ring

    latency, bandwidth = fit_ring({1000: 2e-4 + 1000 / 1e9, 10**6: 2e-4 + 10**6 / 1e9, 10**7: 2e-4 + 0.01}, 2)
    assert (round(latency * 1e6), round(bandwidth / 1e9, 3)) == (100, 1.0)
    profile = network_profile(nn.Sequential(nn.Flatten(), nn.Linear(12, 5)), image_size=2)
    assert (profile["parameters"], profile["parameter_bytes"]) == (65, 260)
    assert profile["units"] == [["0", 0, 0, 48], ["1", 120, 65, 20]]


def test_predictions() -> None:
    from project.tools.plan import Measured, Prediction, scaling_efficiency, share_seconds

    times = {"batch_sizes": [32, 8], "forward": [[0.4], [0.16]], "backward": [[0.8], [0.32]]}
    run = Measured("cpu", 1, 32, 0, 0.4, 0.8, 0, 0, 1, 0, 0, 0, None, units=[["a", 1, 1, 1]], block_seconds=times)
    untimed = Measured(**{**run.__dict__, "block_seconds": None})
    assert [round(t, 3) for t in share_seconds(run, 0.5)] == [0.24, 0.48]
    assert share_seconds(untimed, 0.5) == (0.2, 0.4)
    single = Measured("cuda", 1, 32, 0, 0.25, 0.5, 0.25, 0, 1, 0, 0, 0, None)
    assert scaling_efficiency(Prediction("ddp", 4, {"compute": 1.25}, 128, []), single) == 0.8
