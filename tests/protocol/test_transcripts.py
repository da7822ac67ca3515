"""The conformance transcripts (``transcripts/*.jsonl``, read ``transcript_runner``) against the
Python client session and the shim's C client. Every transcript but the building blocks that
others include runs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from shim.shim_harness import SANITIZER_OPTIONS, SANITIZER_REPORT, requested_sanitizer
from support import scaled
from transcript_runner import HERE, PythonSession, TranscriptFailed, run

from kiwi_jupyter.shim.build import LIBRARY_NAME, compile_library

#: The C entry points the transcripts drive the shim's client through: compiled into a test
#: build only (docs/protocol.md, "Conformance").
CONFORMANCE = Path(__file__).with_name("conformance.c")
#: Included by others, and run through them.
BUILDING_BLOCKS = {"ready.jsonl", "holding.jsonl",
                   "ready_memory.jsonl", "holding_memory.jsonl"}
TRANSCRIPTS = sorted(p.name for p in HERE.glob("*.jsonl") if p.name not in BUILDING_BLOCKS)


@pytest.mark.parametrize("name", TRANSCRIPTS)
def test_the_python_client_session_follows_the_transcript(name: str) -> None:
    run(name, PythonSession())


def test_a_transcript_fails_where_the_client_does_other_than_it_says() -> None:
    # The runner must be able to fail: a client that answers a grant crossing its cancel by
    # holding is caught, on the line that says so.
    class Grabs(PythonSession):
        def receive(self, line: bytes) -> None:
            if b'"grant"' in line and self.session.state.name == "RELEASING":
                self.session.state = type(self.session.state).HOLDING
                return
            super().receive(line)

    with pytest.raises(TranscriptFailed, match=r"grant_crossing_a_cancel.jsonl:5: state HOLDING"):
        run("grant_crossing_a_cancel.jsonl", Grabs())


@pytest.fixture(scope="module")
def shim_run(tmp_path_factory: pytest.TempPathFactory) -> subprocess.CompletedProcess[str]:
    """Every transcript against the shim's C client, in a process of its own (the shim is never
    loaded into the test process): a test build of the shim's sources with the conformance
    entry points (``CONFORMANCE``, which the packaged library does not carry), and with
    KIWI_TEST_SANITIZE=address or thread under those sanitizers, their runtime preloaded (as
    tests/shim do)."""
    env, sanitize = dict(os.environ), None
    wanted = requested_sanitizer()
    if wanted is not None:
        sanitize, runtime = wanted
        env.update(LD_PRELOAD=runtime, **SANITIZER_OPTIONS)
    library = compile_library(tmp_path_factory.mktemp("conformance") / LIBRARY_NAME,
                              sanitize=sanitize, test_sources=[CONFORMANCE])
    return subprocess.run([sys.executable, str(Path(__file__).with_name("transcript_runner.py")),
                           "--shim", str(library), *TRANSCRIPTS],
                          capture_output=True, text=True, timeout=scaled(60), env=env)


@pytest.mark.parametrize("name", TRANSCRIPTS)
def test_the_shims_c_client_follows_the_transcript(
        name: str, shim_run: subprocess.CompletedProcess[str]) -> None:
    said = shim_run.stdout + shim_run.stderr
    assert shim_run.returncode != 3, f"the shim lacks the conformance entry points: {said}"
    assert not SANITIZER_REPORT.search(shim_run.stderr), shim_run.stderr
    verdict = next((line for line in shim_run.stdout.splitlines()
                    if line.split(":", 1)[0].split(" ", 1)[-1] == name), None)
    assert verdict == f"ok {name}", verdict or f"no word on {name}:\n{said}"
