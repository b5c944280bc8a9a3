"""A PyTorch Lightning template for comparing how one image-classification job runs on one device
or many: ``python -m project fit --trainer.strategy=ddp``.

Importing the package is cheap and changes nothing: the strategies are registered where the command
line starts (:func:`project.toolkit.cli.lightning_cli.main`)."""

__version__ = "0.1.0"
