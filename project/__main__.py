"""``python -m project fit|validate|test|predict ...``"""

from project.cli import main

if __name__ == "__main__":
    main()
