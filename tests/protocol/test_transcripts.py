"""The conformance transcripts (``transcripts/*.jsonl``, read ``transcript_runner``) against the
Python client session. Every transcript but the building blocks that others include runs."""

from __future__ import annotations

import pytest
from transcript_runner import HERE, PythonSession, TranscriptFailed, run

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
