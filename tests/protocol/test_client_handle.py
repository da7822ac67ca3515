"""The shim's client keeps all it has in one handle (struct kiwi_client, client/client.h): two
handles in one process, each on the stack of a C test, are two clients that know nothing of
each other. Run in a process of its own through the conformance build."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from conformance_build import ConformanceBuild
from shim.shim_harness import SANITIZER_REPORT
from support import scaled

RUNNER = Path(__file__).with_name("transcript_runner.py")


def test_two_handles_on_the_stack_are_two_clients(conformance_build: ConformanceBuild) -> None:
    run = subprocess.run([sys.executable, str(RUNNER), "--handles",
                          str(conformance_build.library)], capture_output=True, text=True,
                         timeout=scaled(60), env=conformance_build.env)
    assert not SANITIZER_REPORT.search(run.stderr), run.stderr
    assert run.stdout.strip() == "failed 0", run.stdout + run.stderr
