"""The one measuring core, shared by the timing callback, ``bench`` and the benchmarks."""
