"""The conformance transcripts (``transcripts/*.jsonl``, read ``transcript_runner``) against the
Python client session and the shim's C client. Every transcript but the building blocks that
others include runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from support import scaled
from transcript_runner import HERE, PythonSession, TranscriptFailed, run

from kiwi_jupyter.shim import library_path

#: Included by others, and run through them.
BUILDING_BLOCKS = {"ready.jsonl", "holding.jsonl"}
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


def test_the_shims_c_client_follows_every_transcript() -> None:
    """In a process of its own: the shim is never loaded into the test process."""
    done = subprocess.run([sys.executable, str(Path(__file__).with_name("transcript_runner.py")),
                           "--shim", str(library_path()), *TRANSCRIPTS],
                          capture_output=True, text=True, timeout=scaled(60))
    if done.returncode == 3:
        pytest.skip(f"the shim has no conformance entry points yet: {done.stderr.strip()} "
                    "(docs/protocol.md, Conformance)")
    assert done.returncode == 0, done.stdout + done.stderr
