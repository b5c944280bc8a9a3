"""Template vs plain PyTorch, run from the repository root: ``python -m benchmarks.overhead``,
``python -m benchmarks.inference``, ``python -m benchmarks.input`` (``make bench-perf`` runs all three)."""
