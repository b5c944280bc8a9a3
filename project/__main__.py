"""``python -m project fit|validate|test|predict|bench|compare ...``: :func:`project.entry.main`."""

from project.entry import main

if __name__ == "__main__":
    main()
