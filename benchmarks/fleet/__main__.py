"""``python -m benchmarks.fleet``: the command is ``cli``'s."""

from benchmarks.fleet.cli import main

if __name__ == "__main__":
    main()
