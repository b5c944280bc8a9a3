"""The one measuring core: device clocks and memory, statistics, tables, per-rank records and their summary, the
environment, FLOPs, memory traffic and the step anatomy, shared by the timing callback, ``bench`` and the benchmarks."""
