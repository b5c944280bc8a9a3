"""The machinery under the template: the command line, callbacks, strategies, measurement, bench,
the generic data pipeline, checkpoint IO. It never imports the template layer (``project.model``,
``project.nets``, ``project.data``): the model, network and data set reach it through the command
line and the config (``tests/test_layers.py`` holds it to that)."""
