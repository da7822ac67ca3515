"""Install the Kiwi kernelspec: ``python -m kiwi_jupyter.kernelspec install``.

The wheel already installs the kernelspec ``kiwi`` ("Python 3 (Kiwi vGPU)") into
``<prefix>/share/jupyter/kernels/kiwi``. This command is for the other cases: a user-level or
another prefix's install, and images that want Kiwi to *be* their default Python kernel
(``--as-default`` installs it under the name ``python3``, which Jupyter prefers over ipykernel's
built-in spec and opens new notebooks with).

The installed spec runs this interpreter by its full path, as ``ipykernel install`` does, so it
keeps working when Jupyter itself runs from another environment. The Kiwi kernel is ipykernel's
kernel, so the spec declares what ipykernel's own spec declares for the ipykernel installed here
(``kernel_protocol_version``, ``metadata.supported_encryption``, ``metadata.debugger``, whichever
that version has), asked of ipykernel when the spec is written: a fixed copy would claim a newer
ipykernel's protocol or encryption for an older one, and jupyter_client acts on those fields.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from ipykernel.kernelspec import get_kernel_dict
from jupyter_client.kernelspec import KernelSpecManager

SPEC_SOURCE = Path(__file__).parent / "kernel" / "spec"
NAME = "kiwi"
DEFAULT_NAME = "python3"
DISPLAY_NAME = "Python 3 (Kiwi vGPU)"


def kernel_spec(source: dict[str, Any]) -> dict[str, Any]:
    """The ``kiwi`` spec for this interpreter: ipykernel's own spec for the installed ipykernel,
    with Kiwi's argv, display name, env and metadata (from ``source``, the packaged kernel.json)
    in place of ipykernel's. In ``metadata`` ipykernel's keys win: they describe its kernel (the
    packaged ``debugger: true`` is only the guess for an install that runs no code)."""
    spec = get_kernel_dict()
    own = {key: value for key, value in source.items() if key != "metadata"}
    metadata = {**source.get("metadata", {}), **spec.get("metadata", {})}
    spec.update(own, argv=[sys.executable, *source["argv"][1:]], metadata=metadata)
    return spec


def install(
    *,
    user: bool = False,
    prefix: str | None = None,
    as_default: bool = False,
    name: str | None = None,
    display_name: str | None = None,
) -> str:
    """Install the spec; return the folder it went to."""
    kernel_name = name or (DEFAULT_NAME if as_default else NAME)
    with tempfile.TemporaryDirectory() as scratch:
        staged = Path(scratch) / kernel_name
        shutil.copytree(SPEC_SOURCE, staged)
        spec_file = staged / "kernel.json"
        spec = kernel_spec(json.loads(spec_file.read_text()))
        spec["display_name"] = display_name or DISPLAY_NAME
        spec_file.write_text(json.dumps(spec, indent=1) + "\n")
        return KernelSpecManager().install_kernel_spec(
            str(staged), kernel_name, user=user, prefix=prefix
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m kiwi_jupyter.kernelspec",
        description="Install the Kiwi kernelspec (an IPython kernel sharing the GPU through Kiwi).",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    cmd = commands.add_parser("install", help="install the kernelspec")
    where = cmd.add_mutually_exclusive_group()
    where.add_argument("--user", action="store_true", help="for the current user only")
    where.add_argument(
        "--sys-prefix", action="store_true", help=f"into this environment ({sys.prefix})"
    )
    where.add_argument("--prefix", help="into PREFIX/share/jupyter/kernels")
    cmd.add_argument(
        "--as-default",
        action="store_true",
        help=f"install as '{DEFAULT_NAME}', replacing the default Python kernel",
    )
    cmd.add_argument("--name", help=f"kernel name (default '{NAME}', or '{DEFAULT_NAME}')")
    cmd.add_argument("--display-name", help=f"name shown in the launcher ('{DISPLAY_NAME}')")
    args = parser.parse_args(argv)

    prefix = sys.prefix if args.sys_prefix else args.prefix
    try:
        folder = install(
            user=args.user,
            prefix=prefix,
            as_default=args.as_default,
            name=args.name,
            display_name=args.display_name,
        )
    except (OSError, ValueError) as exc:
        print(f"kiwi: could not install the kernelspec: {exc}", file=sys.stderr)
        return 1
    print(f"Installed kernelspec {Path(folder).name} in {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
