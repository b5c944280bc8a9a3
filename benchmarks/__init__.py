"""The template's benchmarks, run from the repository root: template vs plain PyTorch
(``python -m benchmarks.overhead``, ``.inference``, ``.input``; ``make bench-perf`` runs all three) and
the check of every CUDA path on a GPU (``python -m benchmarks.gpu_check``, ``make gpu-check``)."""
