"""The template's benchmarks, run from the repository root: template vs plain PyTorch
(``python -m benchmarks.overhead``, ``.inference``, ``.input``, ``.host_memory``, ``.timing_cost``, ``.host_calls``;
``make bench-perf`` runs all six), learning parity (``.parity``, ``make bench-parity``) and, on a GPU, one command:
``bash benchmarks/gpu_run.sh`` -- the template, Lightning's bare loop and the plain loop side by side per mode
(``.gpu_runs``), and with ``--check`` every CUDA path (``.gpu_check``, ``make gpu-check``)."""
