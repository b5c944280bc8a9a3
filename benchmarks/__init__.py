"""The template's benchmarks: performance against plain PyTorch, and the GPU check
(``python -m benchmarks.gpu_check``)."""
