"""Compiling the shim: the one place that knows its sources and flags.

Used by the wheel build (hatch_build.py at the repository root loads this file by path, before
the package is importable) and by :func:`kiwi_jupyter.shim.library_path`, which builds into a
cache when the packaged library is missing or older than the sources (an editable install whose
C files changed). Nothing here imports the rest of the package.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent
LIBRARY_NAME = "libkiwishim.so"
#: Written beside the library: the hash of the sources it was built from.
STAMP_SUFFIX = ".sources-sha256"

#: Hardened the way distributions build security-sensitive libraries: stack protector,
#: fortified libc calls, full RELRO with immediate binding, a non-executable stack, and nothing
#: exported but the driver entry points, dlsym and the kiwi_shim_* API.
CFLAGS = [
    "-std=c11",
    "-O2",
    "-g0",
    "-fPIC",
    "-fvisibility=hidden",
    "-fstack-protector-strong",
    "-fstack-clash-protection",
    "-D_FORTIFY_SOURCE=2",
    "-Wall",
    "-Wextra",
    "-Wformat=2",
    "-Wformat-security",
    "-Wshadow",
    "-Wstrict-prototypes",
]
LDFLAGS = [
    "-shared",
    "-Wl,-z,relro",
    "-Wl,-z,now",
    "-Wl,-z,noexecstack",
    "-Wl,--no-undefined",
    "-Wl,--as-needed",
]
LIBS = ["-ldl", "-lpthread"]
#: Builds for tests only, by sanitizer: ``address`` (AddressSanitizer and UndefinedBehavior-
#: Sanitizer, every error fatal) and ``thread`` (ThreadSanitizer). Such a library needs the
#: sanitizer's runtime, preloaded before it (``sanitizer_runtime``); the hardening flags that
#: conflict with the sanitizers are left out. KIWI_CHECKED turns on the shim's own checks
#: (client/hold.c says "BUG" aloud when something asks for a move of the hold its table
#: forbids; the tests fail on it).
SANITIZERS = {
    "address": (["-fsanitize=address,undefined", "-fno-sanitize-recover=undefined"], "libasan.so"),
    "thread": (["-fsanitize=thread"], "libtsan.so"),
}
SANITIZE_FLAGS = ["-fno-omit-frame-pointer", "-g", "-O1", "-DKIWI_CHECKED"]


class BuildError(RuntimeError):
    """The C compiler could not build the shim; the message carries its output."""


def sources(directory: Path = HERE) -> list[Path]:
    """The C files and headers: the shared headers at the top, the C files in the three tiers
    (interpose/, mechanisms/, client/; docs/shim.md, "Layout")."""
    return sorted(p for p in directory.rglob("*") if p.suffix in (".c", ".h"))


def sources_hash(directory: Path = HERE) -> str:
    digest = hashlib.sha256()
    for path in sources(directory):
        name = path.relative_to(directory).as_posix()
        digest.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    digest.update(" ".join(CFLAGS + LDFLAGS + LIBS).encode())
    return digest.hexdigest()


def compiler() -> str:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise BuildError("no C compiler found (install gcc, or set CC)")
    return cc


def compile_library(output: Path, directory: Path = HERE, *, sanitize: str | None = None,
                    test_sources: Sequence[Path] = ()) -> Path:
    """Build the shim from the C files in ``directory`` into ``output`` (atomically).

    A test build, never one to ship: ``sanitize``, under one of SANITIZERS; ``test_sources``,
    C files of the tests' own compiled in beside the shim's, which reach the client tier's
    internals (the conformance entry points the protocol's transcripts drive,
    tests/protocol/conformance.c). Nothing test-only is in the sources here, so the packaged
    library exports none of it."""
    output.parent.mkdir(parents=True, exist_ok=True)
    c_files = [str(p) for p in sources(directory) if p.suffix == ".c"]
    c_files += [str(p) for p in test_sources]
    flags = [*CFLAGS, *LDFLAGS]
    if test_sources:
        flags.append(f"-I{directory / 'client'}")
    if sanitize:
        flags = [f for f in flags if f not in ("-O2", "-g0", "-D_FORTIFY_SOURCE=2")]
        flags += [*SANITIZERS[sanitize][0], *SANITIZE_FLAGS]
    with tempfile.TemporaryDirectory(dir=output.parent) as scratch:
        built = Path(scratch) / LIBRARY_NAME
        command = [compiler(), *flags, "-o", str(built), *c_files, *LIBS]
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise BuildError(f"building the CUDA shim failed:\n{' '.join(command)}\n"
                             f"{result.stdout}{result.stderr}")
        os.replace(built, output)
    if not sanitize and not test_sources:  # a test build never passes for the packaged one
        Path(str(output) + STAMP_SUFFIX).write_text(sources_hash(directory) + "\n")
    return output


def sanitizer_runtime(sanitize: str) -> str:
    """The runtime the compiler links a build under ``sanitize`` against: it must come first in
    ``LD_PRELOAD``, before the shim."""
    name = SANITIZERS[sanitize][1]
    result = subprocess.run([compiler(), f"-print-file-name={name}"], capture_output=True,
                            text=True, check=False)
    runtime = result.stdout.strip()
    if result.returncode != 0 or not os.path.isabs(runtime):
        raise BuildError(f"the compiler has no {name} ({runtime!r})")
    return runtime


def is_current(library: Path, directory: Path = HERE) -> bool:
    """Was ``library`` built from the sources now in ``directory``?"""
    stamp = Path(str(library) + STAMP_SUFFIX)
    if not library.is_file() or not stamp.is_file():
        return False
    return stamp.read_text().strip() == sources_hash(directory)
