"""The offline commands of ``python -m project``: each reads what runs wrote (or a checkpoint) and imports only what it
needs. No training run loads this package (``tests/unit/test_layers.py``)."""

# name -> (module with main(argv), what it does): the top-level help lists them
COMMANDS = {
    "bench": ("project.tools.bench", "run a matrix of strategies, archs, batch sizes, devices and precisions; compare"),
    "compare": ("project.tools.bench.compare", "compare finished runs (their timing.json) in bench's results files"),
    "plan": ("project.tools.plan", "predict each strategy's step, throughput and memory on N devices from one run"),
    "export": ("project.tools.export", "a checkpoint as one ONNX or torch.export graph: uint8 images in, logits out"),
    "search": ("project.tools.search", "search fit options with Optuna: trials as runs, pruned per epoch, resumable"),
}
