"""A PyTorch Lightning template for comparing how one image-classification job runs on one device
or many: ``python -m project fit --trainer.strategy=ddp``."""

__version__ = "0.1.0"
