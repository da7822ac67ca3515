"""The shim's decoder of the daemon's lines (kiwi_jupyter/shim/client/decode.c, generated from
the protocol's table): each line read once into a typed message, by the types the table gives
its fields; a line that breaks the protocol is told apart (the client leaves it, and says so),
and so is an op this version does not know. Run in a process of its own through the
conformance build's ``kiwi_conformance_decode``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conformance_build import ConformanceBuild
from shim.shim_harness import SANITIZER_REPORT
from support import scaled

RUNNER = Path(__file__).with_name("transcript_runner.py")

#: A line, and words of what the decoder must read from it.
DECODED = {
    '{"op":"grant","seq":3,"gpu":0,"quantum":30.0}': "op=grant seq=3 has=",
    '{"op":"grant","gpu":1,"quantum":0.5}': "gpu=1 quantum=0.5",
    '{"op":"welcome","version":1,"tq":30,"features":["position","later","memory"]}':
        "features=5 tq=30",
    '{"op":"welcome","version":1,"mode":"on"}': "features=0",
    '{"op":"registered","client":"c7","evict":"vmm","pin_budget":1073741824}':
        "client=c7 evict=vmm pin_budget=1073741824",
    '{"op":"drop","gpu":0,"reason":"room","evict":true,"grace":5}':
        "reason=room evict=1 grace=5",
    '{"op":"evict","gpu":0,"bytes":1073741824,"for":"nbB.ipynb"}':
        "bytes=1073741824 for=nbB.ipynb",
    '{"op":"error","code":"room","message":"nb \\"B\\" needs\\n4 GiB"}':
        'code=room message=nb "B" needs 4 GiB',
    '{"op":"waiting","position":2}': "seq=-1 has=",
    # A nested object, or a key inside a string, is never mistaken for a field.
    '{"op":"status","seq":2,"status":{"op":"grant","seq":9}}': "op=status seq=2",
    '{"note":"\\"op\\":\\"grant\\"","op":"mode","mode":"on"}': "op=mode",
    '  {"op" : "released" , "seq" : 4 , "evict" : false }  ': "op=released seq=4",
}

MALFORMED = [
    "not json",
    "[1,2]",
    '{"op":"grant"} and more',
    '{"op":"grant",}',
    '{"op":"grant"',
    '{"op":"grant","gpu":}',
    '{"seq":1}',
    '{"op":7}',
    '{"op":"grant","seq":-1}',
    '{"op":"grant","seq":"1"}',
    '{"op":"grant","seq":1.5}',
    '{"op":"grant","quantum":"long"}',
    '{"op":"drop","evict":"yes"}',
    '{"op":"waiting","position":1.5}',
    '{"op":"waiting","position":99999999999999999999999}',
    '{"op":"welcome","features":"memory"}',
    '{"op":"error","code":404}',
]


@pytest.fixture(scope="module")
def decoded(conformance_build: ConformanceBuild) -> dict[str, tuple[str, str]]:
    lines = [*DECODED, *MALFORMED, '{"op":"teleport","seq":1}',
             '{"op":"error","message":"' + "x" * 400 + '"}']
    run = subprocess.run([sys.executable, str(RUNNER), "--decode",
                          str(conformance_build.library)], input="\n".join(lines) + "\n",
                         capture_output=True, text=True, timeout=scaled(60),
                         env=conformance_build.env)
    assert run.returncode == 0 and not SANITIZER_REPORT.search(run.stderr), run.stderr
    verdicts = [tuple(out.split("\t", 1)) for out in run.stdout.splitlines()]
    assert len(verdicts) == len(lines), run.stdout
    return dict(zip(lines, verdicts, strict=True))  # type: ignore[arg-type]


@pytest.mark.parametrize("line", DECODED)
def test_a_line_is_read_once_into_its_typed_message(
        line: str, decoded: dict[str, tuple[str, str]]) -> None:
    verdict, read = decoded[line]
    assert verdict == "decoded", read
    assert DECODED[line] in read


@pytest.mark.parametrize("line", MALFORMED)
def test_a_line_that_breaks_the_protocol_is_told_apart(
        line: str, decoded: dict[str, tuple[str, str]]) -> None:
    assert decoded[line][0] == "malformed", decoded[line]


def test_an_op_this_version_does_not_know_is_no_malformed_line(
        decoded: dict[str, tuple[str, str]]) -> None:
    assert decoded['{"op":"teleport","seq":1}'] == ("unknown_op", "op=teleport seq=1 has=1")


def test_a_text_longer_than_its_member_is_cut_and_says_so(
        decoded: dict[str, tuple[str, str]]) -> None:
    verdict, read = decoded['{"op":"error","message":"' + "x" * 400 + '"}']
    message = read.split("message=", 1)[1]
    assert verdict == "decoded" and message == "x" * 252 + "..."
