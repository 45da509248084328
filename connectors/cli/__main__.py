"""`python -m connectors.cli ...`: how the tests and `cronlog run` start every process."""

from connectors.cli import main

if __name__ == "__main__":
    main()
