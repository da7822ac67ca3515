"""The access policy in a running daemon: a peer of another uid, judged by the credentials the
daemon reads from the socket, may not claim HIGH in a guaranteed pool."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

NOBODY = 65534
SYSTEM_PYTHON = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin")

ACCESS = """\
socket_mode: "0666"
pools:
  training:   {guarantee: 0.3, weight: 1, maximum: 0.7}
  simulation: {guarantee: 0.5, weight: 3, maximum: -1}
access:
  on_violation: refuse
  default: {pools: [default, training], priorities: [NORMAL, LOW]}
"""

# The peer speaks the wire protocol itself: it runs as another user, who cannot read the repo.
PEER = """\
import json, socket, sys
sock = socket.socket(socket.AF_UNIX)
sock.connect(sys.argv[1])
lines = sock.makefile("r")
for n, message in enumerate(json.loads(sys.argv[2]), 1):
    sock.sendall((json.dumps({**message, "seq": n}) + "\\n").encode())
    print(lines.readline(), end="", flush=True)
"""


def as_nobody(socket_path: str, *messages: dict) -> list[dict]:
    hello = {"op": "hello", "version": 1}
    # The system's interpreter: the test's own may live where the other user cannot go.
    result = subprocess.run([SYSTEM_PYTHON or "python3", "-c", PEER, socket_path,
                             json.dumps([hello, *messages])], cwd="/", user=NOBODY,
                            group=NOBODY, extra_groups=[], capture_output=True, text=True,
                            timeout=30)
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


@pytest.mark.skipif(os.geteuid() != 0 or SYSTEM_PYTHON is None,
                    reason="needs root (to run a peer as another uid) and a system python3")
def test_a_peer_of_another_uid_claiming_high_in_a_guaranteed_pool_is_refused(start_daemon,
                                                                             scratch):
    config = scratch / "kiwi.yaml"
    config.write_text(ACCESS)
    daemon = start_daemon("--tq", "5", "--config", str(config))
    os.chmod(os.path.dirname(daemon.socket), 0o755)  # let the other user reach the socket
    _, refused = as_nobody(daemon.socket, {"op": "register", "name": "greedy",
                                           "pool": "simulation", "priority": "HIGH"})
    assert refused["op"] == "error" and refused["code"] == "permission"
    assert f"uid {NOBODY} may not use pool 'simulation' at priority HIGH" in refused["message"]
    _, allowed = as_nobody(daemon.socket, {"op": "register", "name": "modest",
                                           "pool": "training", "priority": "NORMAL"})
    assert allowed["op"] == "registered"
