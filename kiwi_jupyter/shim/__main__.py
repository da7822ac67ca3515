"""``python -m kiwi_jupyter.shim path``: print where the shim library is (building it if needed).

``python -m kiwi_jupyter.shim env`` prints an ``LD_PRELOAD=...`` line for a shell.
"""

from __future__ import annotations

import argparse
import sys

from kiwi_jupyter.shim import BuildError, library_path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kiwi_jupyter.shim",
                                     description="The Kiwi CUDA shim library.")
    parser.add_argument("command", choices=["path", "env"],
                        help="path: print the library's path; env: print LD_PRELOAD=<path>")
    args = parser.parse_args(argv)
    try:
        path = library_path()
    except BuildError as exc:
        print(f"kiwi shim: {exc}", file=sys.stderr)
        return 1
    print(path if args.command == "path" else f"LD_PRELOAD={path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
