"""Containers of the built images, made with buildah.

Commands run in a container with `buildah run --isolation chroot`, as the image's own user: the
machines here refuse the namespaces and limits an OCI runtime (podman run) sets up, and a chroot
on the host's network is enough to start the programs and talk to them.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
#: Where the tests of this folder appear inside a container.
TESTS_INSIDE = "/kiwi-tests"


def _tag() -> str:
    for line in (REPO / "pyproject.toml").read_text().splitlines():
        if line.startswith("version = "):
            return line.split('"')[1]
    raise AssertionError("pyproject.toml has no version")


#: The images `make images` builds (images/build.sh names them the same way).
NODE_IMAGE = os.environ.get("KIWI_NODE_IMAGE", f"localhost/kiwi-node:{_tag()}")
NOTEBOOK_IMAGE = os.environ.get("KIWI_NOTEBOOK_IMAGE", f"localhost/kiwi-notebook:{_tag()}")


class Container:
    """A working container of an image; commands run in it as the image's user."""

    def __init__(self, image: str, volumes: dict[Path, str]) -> None:
        self.image = image
        found = subprocess.run(["buildah", "inspect", "--type", "image", image],
                               capture_output=True, text=True)
        assert found.returncode == 0, f"{image} is not built: make images"
        self.name = subprocess.run(["buildah", "from", "--pull=never", "--quiet", image],
                                   check=True, capture_output=True, text=True).stdout.strip()
        self.volumes = [f"{host}:{inside}:ro" for host, inside in
                        {REPO / "tests" / "images": TESTS_INSIDE, **volumes}.items()]

    def command(self, argv: Sequence[str], env: dict[str, str] | None = None) -> list[str]:
        options = [f"--volume={v}" for v in self.volumes]
        options += [f"--env={name}={value}" for name, value in (env or {}).items()]
        return ["buildah", "run", "--isolation", "chroot", *options, self.name, "--", *argv]

    def run(self, *argv: str, env: dict[str, str] | None = None,
            timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.command(argv, env), capture_output=True, text=True,
                              timeout=timeout)

    def remove(self) -> None:
        subprocess.run(["buildah", "rm", self.name], capture_output=True)


def container_of(image: str, volumes: dict[Path, str] | None = None) -> Iterator[Container]:
    container = Container(image, volumes or {})
    try:
        yield container
    finally:
        container.remove()
