"""``python -m project fit|validate|test|predict|bench|compare ...``: the command line, :func:`project.cli.main`."""

from project.cli import main

if __name__ == "__main__":
    main()
