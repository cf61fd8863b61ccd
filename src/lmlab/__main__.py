"""`python -m lmlab`: the same command line as `lmlab`."""

from lmlab.cli import main

if __name__ == "__main__":
    main()
