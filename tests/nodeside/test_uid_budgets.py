"""The node's budgets of clients and label bytes, shared out by uid (issue 34.4): one user who
registers all they can fills their own share, and another user's kernel still registers."""

from __future__ import annotations

import os
import pickle
import resource
import textwrap
from pathlib import Path

from other_users import NOBODY, SOMEONE, Peer, as_user, needs_root, open_to_everyone
from support import DaemonProcess

from nodeside import limits

pytestmark = needs_root

OPEN = "socket_mode: '0666'\n"


def daemon_for_everyone(start_daemon, scratch: Path, extra: str = "") -> DaemonProcess:
    config = scratch / "kiwi.yaml"
    config.write_text(OPEN + textwrap.dedent(extra))
    daemon = start_daemon("--config", str(config))
    open_to_everyone(daemon.directory)
    return daemon


def register_all_you_can(socket_path: str, most: int, labels: dict[str, str]
                         ) -> tuple[list[Peer], str]:
    """As the attacker: register until refused (or ``most``). Returns the registered
    connections, to be kept open until the victim has tried, and the refusal."""
    peers = []
    refusal = ""
    for i in range(most):
        peer = Peer(socket_path)
        reply = peer.request({"op": "register", "name": f"hog-{i}", "labels": labels})
        if reply["op"] != "registered":
            refusal = f"{reply.get('code')}: {reply.get('message')}"
            break
        peers.append(peer)
    return peers, refusal


def hogs_then_victim(daemon: DaemonProcess, uids: list[int], most: int,
                     labels: dict[str, str], victim_uid: int = SOMEONE,
                     victim_labels: dict[str, str] | None = None
                     ) -> tuple[list[tuple[int, str]], dict]:
    """Each hog (a uid of ``uids``, one after another, each in a child of its own) registers
    all it can and keeps it; then a kernel of ``victim_uid`` registers. Returns each hog's count
    and refusal, and the victim's reply."""
    hogs: list[tuple[int, int, tuple[int, str]]] = []
    try:
        for uid in uids:
            read_end, write_end = os.pipe()
            go_end, wait_end = os.pipe()
            pid = os.fork()
            if pid == 0:  # a hog, holding its connections until the victim has tried
                try:
                    os.setgroups([])
                    os.setgid(uid)
                    os.setuid(uid)
                    resource.setrlimit(resource.RLIMIT_NOFILE, (4096, 4096))
                    peers, refusal = register_all_you_can(daemon.socket, most, labels)
                    os.write(write_end, pickle.dumps((len(peers), refusal)))
                    os.close(write_end)  # the test reads to the end of what was written
                    os.read(go_end, 1)
                finally:
                    os._exit(0)
            os.close(write_end)
            os.close(go_end)
            with os.fdopen(read_end, "rb") as answer:
                hogs.append((pid, wait_end, pickle.loads(answer.read())))
        victim = as_user(victim_uid, lambda: Peer(daemon.socket).request(
            {"op": "register", "name": "victim",
             "labels": victim_labels if victim_labels is not None else {"pod": "victim-pod"}}))
    finally:
        for pid, wait_end, _ in hogs:
            os.write(wait_end, b"x")
            os.waitpid(pid, 0)
    return [got for _, _, got in hogs], victim


def hog_then_victim(daemon: DaemonProcess, most: int, labels: dict[str, str]
                    ) -> tuple[int, str, dict]:
    """The hog (uid NOBODY) registers all it can and keeps it; then a kernel of another user
    registers. Returns the hog's count and refusal, and the victim's reply."""
    [(count, refusal)], victim = hogs_then_victim(daemon, [NOBODY], most, labels)
    return count, refusal, victim


def test_one_uid_gets_its_share_of_the_client_slots_and_another_user_still_registers(
        start_daemon, scratch) -> None:
    daemon = daemon_for_everyone(start_daemon, scratch)
    share = int(limits.MAX_CLIENTS * limits.ConnectionLimits().uid_share)
    count, refusal, victim = hog_then_victim(daemon, limits.MAX_CLIENTS, {})
    assert count == share
    assert refusal.startswith("limit:") and f"uid {NOBODY}" in refusal and "uid_share" in refusal
    assert victim["op"] == "registered", victim
    assert daemon.log().count(f"(uid {NOBODY})") >= 1 and "Traceback" not in daemon.log()


def test_one_uid_gets_its_share_of_the_label_bytes_and_another_user_still_registers(
        start_daemon, scratch) -> None:
    daemon = daemon_for_everyone(start_daemon, scratch)
    # As many labels as one client may carry, each as long as a label may be: ~29 KiB.
    labels = {f"{i:03d}" + "k" * 200: "v" * limits.MAX_NAME_BYTES
              for i in range(limits.MAX_LABELS)}
    count, refusal, victim = hog_then_victim(daemon, 200, labels)
    per_client = sum(len(k) + len(v) for k, v in labels.items())
    share = int(limits.MAX_LABEL_BYTES_TOTAL * limits.ConnectionLimits().uid_share)
    assert count == share // per_client
    assert refusal.startswith("limit: labels") and f"uid {NOBODY}" in refusal
    assert victim["op"] == "registered", victim


def test_the_share_is_configurable(start_daemon, scratch) -> None:
    daemon = daemon_for_everyone(start_daemon, scratch, "connections: {uid_share: 0.01}\n")
    count, refusal, victim = hog_then_victim(daemon, 100, {})
    assert count == int(limits.MAX_CLIENTS * 0.01)
    assert "uid_share 0.01" in refusal
    assert victim["op"] == "registered"
