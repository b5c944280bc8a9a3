"""``python -m project fit|validate|test|predict ...`` (LightningCLI) and ``python -m project bench ...``."""

import sys

from project.cli import main

if __name__ == "__main__":
    if sys.argv[1:2] == ["bench"]:
        from project.bench import main as bench_main  # not a LightningCLI subcommand: it runs them

        bench_main(sys.argv[2:])
    else:
        main()
