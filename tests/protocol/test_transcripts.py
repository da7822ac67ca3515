"""The conformance transcripts (``transcripts/*.jsonl``, read ``transcript_runner``) against the
Python client session and the shim's C client. Every transcript but the building blocks that
others include runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conformance_build import ConformanceBuild
from shim.shim_harness import SANITIZER_REPORT
from support import scaled
from transcript_runner import HERE, PythonSession, TranscriptFailed, asked_features, calls, run

#: Included by others, and run through them.
BUILDING_BLOCKS = {"ready.jsonl", "holding.jsonl",
                   "ready_memory.jsonl", "holding_memory.jsonl", "ready_tiers.jsonl"}
TRANSCRIPTS = sorted(p.name for p in HERE.glob("*.jsonl") if p.name not in BUILDING_BLOCKS)
#: The shim's C client follows them all, but those of the Jupyter server's requests
#: (``intent``, sent over the Python session by kiwi_jupyter/server/intents.py): a kernel never
#: hints at itself.
SERVER_CALLS = {"intent"}
SHIM_TRANSCRIPTS = [name for name in TRANSCRIPTS if not calls(name) & SERVER_CALLS]


@pytest.mark.parametrize("name", TRANSCRIPTS)
def test_the_python_client_session_follows_the_transcript(name: str) -> None:
    run(name, PythonSession(asked_features(name)))


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
        run("grant_crossing_a_cancel.jsonl", Grabs(asked_features("grant_crossing_a_cancel.jsonl")))


@pytest.fixture(scope="module")
def shim_run(conformance_build: ConformanceBuild) -> subprocess.CompletedProcess[str]:
    """Every transcript against the shim's C client, in a process of its own: a test build of
    the shim's sources with the conformance entry points (conftest.py)."""
    return subprocess.run([sys.executable, str(Path(__file__).with_name("transcript_runner.py")),
                           "--shim", str(conformance_build.library), *SHIM_TRANSCRIPTS],
                          capture_output=True, text=True, timeout=scaled(60),
                          env=conformance_build.env)


@pytest.mark.parametrize("name", SHIM_TRANSCRIPTS)
def test_the_shims_c_client_follows_the_transcript(
        name: str, shim_run: subprocess.CompletedProcess[str]) -> None:
    said = shim_run.stdout + shim_run.stderr
    assert shim_run.returncode != 3, f"the shim lacks the conformance entry points: {said}"
    assert not SANITIZER_REPORT.search(shim_run.stderr), shim_run.stderr
    verdict = next((line for line in shim_run.stdout.splitlines()
                    if line.split(":", 1)[0].split(" ", 1)[-1] == name), None)
    assert verdict == f"ok {name}", verdict or f"no word on {name}:\n{said}"
