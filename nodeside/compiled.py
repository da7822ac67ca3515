"""The compiled core: which modules mypyc compiles, how they are built, and which core runs.

A handoff runs about 190 Python calls through the session, the request handlers, the scheduler
core and the delivery of its actions (issue 12). mypyc compiles those modules, unchanged, into C
extensions that sit next to their sources; the wheel build (``hatch_build.py``) and an editable
install (``make install``) build them. The sources stay the truth and a working fallback: the
pure Python modules run whenever the compiled ones cannot be trusted to be these sources, and
always with ``KIWI_PURE_PYTHON=1``.

The choice is made once per process, for every compiled module together: within one mypyc
group the modules call each other's C code directly, so a process must never mix a compiled
module with the source of another. The build writes a stamp, the SHA-256 of the sources it
compiled; the compiled modules run only if the sources read the same now (an edited source makes
a stale build, and a stale build must never run in its place), every module's extension is there
and the group's shared library loads. Otherwise a finder at the front of ``sys.meta_path`` hands
out the sources. Nothing here may stop the daemon from starting: every failure means "pure".

Every process that imports a compiled module makes this check, kernels and ``kiwictl`` included,
so it must cost little: the stamp also records each source's size and modification time (in
nanoseconds) when it was hashed, and while every one still matches the sources are not read
again, as make and Python's own bytecode cache trust the same two facts. Any difference, even a
touch, means hashing them again, and the hash decides. Hence too the lazy ``hashlib`` (it loads
OpenSSL) and a finder without ``importlib.abc`` (which imports ``importlib.resources``).

This file is loaded by path from ``hatch_build.py`` (the package is not importable while it is
being built), so it imports nothing from nodeside.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

#: The modules mypyc compiles: the wire format, the bounds, the scheduler core and the daemon's
#: per-request path (a connection's turn, its session, its requests, the router carrying out
#: what they return, delivering actions past the checkpoint evictor's lines, the timers). Not
#: anything a client, a kernel or kiwictl needs on its own.
MODULES: tuple[str, ...] = (
    "nodeside.protocol.names",
    "nodeside.protocol.wire",
    "nodeside.limits",
    "nodeside.model",
    "nodeside.scheduler.access",
    "nodeside.scheduler.actions",
    "nodeside.scheduler.attained",
    "nodeside.scheduler.choosing",
    "nodeside.scheduler.clients",
    "nodeside.scheduler.controls",
    "nodeside.scheduler.core",
    "nodeside.scheduler.history",
    "nodeside.scheduler.interactive",
    "nodeside.scheduler.ledger",
    "nodeside.scheduler.light",
    "nodeside.scheduler.light_first",
    "nodeside.scheduler.membership",
    "nodeside.scheduler.meter",
    "nodeside.scheduler.moves",
    "nodeside.scheduler.node",
    "nodeside.scheduler.policies",
    "nodeside.scheduler.pools",
    "nodeside.scheduler.pricing",
    "nodeside.scheduler.queries",
    "nodeside.scheduler.queue",
    "nodeside.scheduler.report",
    "nodeside.scheduler.residency",
    "nodeside.scheduler.room",
    "nodeside.scheduler.gpu_state",
    "nodeside.scheduler.status",
    "nodeside.scheduler.taking_turns",
    "nodeside.scheduler.tiers",
    "nodeside.scheduler.turns",
    "nodeside.scheduler.view",
    "nodeside.daemon.changes",
    "nodeside.daemon.connection",
    "nodeside.daemon.delivery",
    "nodeside.daemon.lograte",
    "nodeside.daemon.options",
    "nodeside.daemon.peer",
    "nodeside.daemon.positions",
    "nodeside.daemon.registration",
    "nodeside.daemon.requests",
    "nodeside.daemon.router",
    "nodeside.daemon.server",
    "nodeside.daemon.session",
    "nodeside.daemon.shell",
    "nodeside.daemon.status_line",
    "nodeside.daemon.tier_requests",
    "nodeside.daemon.timers",
    "nodeside.evict.lines",
)
#: mypyc's group: its shared library is ``nodeside/core__mypyc.<suffix>``.
GROUP = "nodeside.core"
_LIBRARY = GROUP + "__mypyc"
#: The extensions a build writes: one per module, and the group's shared library.
_EXTENSIONS: tuple[str, ...] = (*MODULES, _LIBRARY)
#: Next to nodeside/__init__.py: the SHA-256 of the sources the extensions were built from.
STAMP = "compiled.sha256"
#: Set (to anything but "" or "0") at run time: the sources run; at build time: nothing is
#: compiled.
PURE_ENV = "KIWI_PURE_PYTHON"


def source(root: Path, module: str) -> Path:
    return root.joinpath(*module.split(".")).with_suffix(".py")


def extension(root: Path, module: str) -> Path:
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    return root.joinpath(*module.split(".")).with_name(module.rsplit(".", 1)[-1] + suffix)


def built_files(root: Path) -> list[Path]:
    """Everything a build writes into the source tree (and the wheel carries)."""
    return [*(extension(root, m) for m in _EXTENSIONS), root / "nodeside" / STAMP]


def sources_digest(root: Path) -> str:
    import hashlib

    digest = hashlib.sha256()
    for module in MODULES:
        digest.update(module.encode() + b"\0")
        digest.update(source(root, module).read_bytes())
    return digest.hexdigest()


def source_marks(root: Path) -> list[str]:
    """Each source's size and modification time, one line each, as the stamp records them."""
    marks = []
    for module in MODULES:
        status = source(root, module).stat()
        marks.append(f"{status.st_size} {status.st_mtime_ns} {module}")
    return marks


def stamp_text(root: Path) -> str:
    """What the stamp says of the sources as they are now: their digest, then their marks."""
    marks = source_marks(root)  # before reading them: an edit while hashing then never matches
    return "\n".join([sources_digest(root), *marks]) + "\n"


def sources_changed(root: Path, stamp: str) -> bool:
    """Do the sources differ from those the stamp was written for? Hashes them only when a
    size or a time differs (or the stamp, from an older build, records none)."""
    digest, *marks = stamp.strip().split("\n")
    return marks != source_marks(root) and digest.strip() != sources_digest(root)


def pure_asked(environ: Mapping[str, str]) -> bool:
    return environ.get(PURE_ENV, "") not in ("", "0")


# -- which core runs ------------------------------------------------------------------------

@dataclass(frozen=True)
class Core:
    compiled: bool
    #: Why the sources run, when they do.
    reason: str = ""

    def __str__(self) -> str:
        return "compiled (mypyc)" if self.compiled else f"pure Python ({self.reason})"


def choose(root: Path, environ: Mapping[str, str]) -> Core:
    """May the compiled modules under ``root`` run? Never raises: any doubt means no."""
    if pure_asked(environ):
        return Core(False, f"{PURE_ENV} is set")
    try:
        recorded = (root / "nodeside" / STAMP).read_text()
    except OSError:
        return Core(False, "not compiled")
    try:
        if sources_changed(root, recorded):
            return Core(False, "the compiled modules were built from other sources; rebuild "
                               "them with `make core` or `pip install -e .`")
        missing = [m for m in _EXTENSIONS if not extension(root, m).is_file()]
        if missing:
            return Core(False, f"the compiled module {missing[0]} is missing")
        importlib.import_module(_LIBRARY)
    except Exception as exc:  # an unreadable source, a library built for another Python...
        return Core(False, f"the compiled modules do not load: {type(exc).__name__}: {exc}")
    return Core(True)


class SourcesFinder:
    """Hands out the compiled modules' sources, or lets the extensions be found as usual.

    Python prefers an extension to a source of the same name; this finder comes first and
    decides, for the first of the modules asked for, for all of them. The import system asks a
    meta path finder only for ``find_spec`` (``invalidate_caches`` if it has one), so it
    needs no base class."""

    def __init__(self, root: Path, environ: Mapping[str, str]) -> None:
        self.root = root
        self.environ = environ
        self._core: Core | None = None
        self._names = frozenset(MODULES)

    @property
    def core(self) -> Core:
        if self._core is None:
            self._core = choose(self.root, self.environ)
        return self._core

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self._names or self.core.compiled:
            return None
        loaders = [(importlib.machinery.SourceFileLoader, importlib.machinery.SOURCE_SUFFIXES)]
        for entry in path or ():
            spec = importlib.machinery.FileFinder(entry, *loaders).find_spec(fullname, target)
            if spec is not None:
                return spec
        return None


def install(root: Path) -> SourcesFinder:
    """Put the finder first on ``sys.meta_path`` (once per process)."""
    for finder in sys.meta_path:
        if isinstance(finder, SourcesFinder):
            return finder
    finder = SourcesFinder(root, os.environ)
    sys.meta_path.insert(0, finder)
    return finder


# -- the build ------------------------------------------------------------------------------

def up_to_date(root: Path) -> bool:
    return choose(root, {}).compiled


def build(root: Path) -> list[Path]:
    """Compile the modules in place, next to their sources, and write the stamp; returns what
    it wrote. Needs mypy (mypyc), setuptools and a C compiler; raises if any is missing."""
    from mypyc.build import mypycify
    from setuptools import Distribution
    from setuptools.command.build_ext import build_ext

    stamp = stamp_text(root)
    here = os.getcwd()
    os.chdir(root)  # mypyc names modules after paths relative to where it runs
    try:
        # In .build/, not build/: a folder named build/ in the repository root would stand in
        # for the `build` module of `python -m build` run there.
        extensions = mypycify([str(source(Path("."), m)) for m in MODULES], group_name=GROUP,
                              target_dir=os.path.join(".build", "mypyc"))
        command = build_ext(Distribution({"name": "kiwi-core", "ext_modules": extensions}))
        command.inplace = True
        command.build_temp = os.path.join(".build", "mypyc-temp")
        command.build_lib = os.path.join(".build", "lib")
        command.ensure_finalized()
        command.run()
    finally:
        os.chdir(here)
    _write_stamp(root, stamp)
    return built_files(root)


def restamp(root: Path) -> bool:
    """Record the sources' sizes and times anew in an up-to-date build's stamp (a checkout
    touches files it leaves unchanged; an older stamp records none), so that imports skip
    hashing again. False, and nothing written, when the sources differ from the build's."""
    try:
        recorded = (root / "nodeside" / STAMP).read_text()
    except OSError:
        return False
    stamp = stamp_text(root)
    if recorded.split("\n", 1)[0].strip() != stamp.split("\n", 1)[0]:
        return False
    if recorded != stamp:
        _write_stamp(root, stamp)
    return True


def _write_stamp(root: Path, stamp: str) -> None:
    # Whole or not at all: a process starting meanwhile must never read half a stamp.
    path = root / "nodeside" / STAMP
    partial = path.with_name(f"{STAMP}.{os.getpid()}")
    partial.write_text(stamp)
    os.replace(partial, path)


def main(argv: Sequence[str] = ()) -> None:
    """``make core``: build in place, or with ``--if-stale`` only when the sources changed."""
    root = Path(__file__).resolve().parents[1]
    if "--if-stale" not in argv or not (up_to_date(root) and restamp(root)):
        for written in build(root):
            print(written.relative_to(root))
    print(f"scheduler core: {choose(root, os.environ)}")
