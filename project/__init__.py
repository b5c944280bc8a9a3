"""A PyTorch Lightning template for comparing how one image-classification job runs on one device
or many: ``python -m project fit --trainer.strategy=ddp``."""

import atexit

from project.strategies import leave_gloo_process_group, register_strategies

__version__ = "0.1.0"

# Before any Trainer exists, and in every process a launcher starts: each of them imports the package.
register_strategies()
atexit.register(leave_gloo_process_group)
