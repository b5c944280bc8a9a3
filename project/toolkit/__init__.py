"""The machinery under the template; it never imports the template layer (``project.model``, ``.nets``, ``.data``)."""
