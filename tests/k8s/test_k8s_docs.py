"""docs/kubernetes.md: the operations guide's steps as written, with commands that parse."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from nodeside.ctl import build_parser as kiwictl_parser
from nodeside.deviceplugin.main import build_parser as plugin_parser

REPO = Path(__file__).resolve().parents[2]
DOC = (REPO / "docs" / "kubernetes.md").read_text()
# Continuation lines joined, as the shell reads them.
COMMANDS = re.sub(r"\\\n\s*", "", DOC)


def _invocations(program: str) -> list[list[str]]:
    found = []
    for line in COMMANDS.splitlines():
        if f"-- {program} " in line or line.strip().startswith(f"{program} "):
            words = shlex.split(line.split(f"{program} ", 1)[1].split("|")[0])
            found.append(words)
    return found


def test_every_kiwictl_command_in_the_guide_parses():
    invocations = _invocations("kiwictl")
    assert len(invocations) >= 5
    for words in invocations:
        kiwictl_parser().parse_args(words)


@pytest.mark.parametrize("step", [
    "kubectl get pod \\\n    -n kiwi-system -l name=kiwi-scheduler -o json",
    "-n kiwi-system -- kiwictl -S on",
    "-n kiwi-system -- kiwictl -S off",
    "kubectl logs ${KIWI_SCHEDULER_POD_NAME?} -n kiwi-system",
    "[INFO] Received SCHED_ON from <UNREGISTERED> [FD=5]",
    "[INFO] Scheduler status changed to ON, broadcasting it ...",
])
def test_the_operations_guide_steps_appear_as_the_seed_writes_them(step):
    def flat(text: str) -> str:
        return re.sub(r"\\\n\s*|\s+", " ", text)

    assert flat(step) in flat(DOC)


def test_the_documented_device_plugin_flags_exist():
    flags = set(re.findall(r"`(--[a-z-]+)", DOC.split("`kiwi-device-plugin` flags:")[1]
                           .split("\n\n")[0]))
    known = {a for action in plugin_parser()._actions for a in action.option_strings}
    assert flags and flags <= known
