"""The template's benchmarks, run from the repository root: template vs plain PyTorch
(``python -m benchmarks.overhead``, ``.inference``, ``.input``, ``.host_memory``, ``.timing_cost``, ``.host_calls``;
``make bench-perf`` runs all six), learning parity (``.parity``, ``make bench-parity``) and, on a GPU, the check
of every CUDA path (``python -m benchmarks.gpu_check``, ``make gpu-check``) and the default job (``.gpu_job``)."""
