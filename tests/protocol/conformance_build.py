"""The shim's client in a test build with the conformance entry points (conformance.c), for the
transcripts and the C decoder's tests (conftest.py's ``conformance_build``, once a session). It
runs only in processes of their own: the shim is never loaded into the test process."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from run_builds import BuildOnce
from shim.shim_harness import SANITIZER_OPTIONS, requested_sanitizer

from kiwi_jupyter.shim.build import LIBRARY_NAME, compile_library

#: The C entry points the tests drive the shim's client through: compiled into a test build
#: only (docs/protocol.md, "Conformance").
CONFORMANCE = Path(__file__).with_name("conformance.c")


@dataclass(frozen=True)
class ConformanceBuild:
    library: Path
    #: The environment to run it in: with KIWI_TEST_SANITIZE=address or thread, the
    #: sanitizer's runtime preloaded (as tests/shim do).
    env: dict[str, str]


def build(build_once: BuildOnce) -> ConformanceBuild:
    env, sanitize = dict(os.environ), None
    wanted = requested_sanitizer()
    if wanted is not None:
        sanitize, runtime = wanted
        env.update(LD_PRELOAD=runtime, **SANITIZER_OPTIONS)
    library = build_once("conformance", lambda directory: compile_library(
        directory / LIBRARY_NAME, sanitize=sanitize, test_sources=[CONFORMANCE]))
    return ConformanceBuild(library, env)
