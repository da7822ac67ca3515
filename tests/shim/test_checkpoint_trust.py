"""The checkpoint evictor acts only on the process that registered, and never blocks a GPU for
good (issue 34.2): the real daemon loading the fake driver, real peers on its socket."""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from other_users import Peer, as_user
from test_checkpoint_evictor import checkpoint_state, hold_with, kernel, status_of

from nodeside import protocol as p
from nodeside.client import Client
from nodeside.evict.identity import read_identity

GiB = 1 << 30
NOBODY = 65534
#: The fake driver's process states (fake_cuda.c): the first int of <dir>/<pid>.
RUNNING, CHECKPOINTED = 0, 2


def driver_state(checkpoint_dir: Path, pid: int) -> int:
    return int.from_bytes((checkpoint_dir / str(pid)).read_bytes()[:4], "little")


def next_holder_gets_the_gpu(socket_path: str, timeout: float) -> Client:
    """A client that needs the room of a 6 GiB holder, granted within ``timeout``."""
    client = Client(socket_path, name="next")
    client.report_working_set(6 * GiB)
    client.acquire(timeout=timeout)
    return client


def test_a_client_that_is_no_cuda_process_does_not_block_the_gpu(
        checkpointing) -> None:
    scheduler = checkpointing("--grace", "30")
    liar = socket.socket(socket.AF_UNIX)
    liar.settimeout(30)
    liar.connect(scheduler.socket)
    lines = liar.makefile("rb")

    def ask(op: str, **fields: object) -> dict:
        liar.sendall(p.encode(op, seq=1, **fields))
        while True:
            reply = json.loads(lines.readline())
            if reply.get("seq") == 1:
                return reply

    liar.sendall(p.encode(p.HELLO, version=p.VERSION))
    lines.readline()
    assert ask(p.REGISTER, name="liar", evict="checkpoint")["evict"] == "checkpoint"
    assert ask(p.ACQUIRE)["op"] == p.GRANT
    assert ask(p.WORKING_SET, bytes=6 * GiB)["op"] == p.OK
    granted: list[Client] = []
    waiting = threading.Thread(
        target=lambda: granted.append(next_holder_gets_the_gpu(scheduler.socket, 30)),
        daemon=True)
    waiting.start()
    while json.loads(lines.readline())["op"] != p.DROP:  # its quantum ends: leave, evicting
        pass
    assert ask(p.RELEASE)["op"] == p.RELEASED
    # The lock fails (no CUDA process has that pid): the GPU goes on at once, while the liar
    # keeps its connection, and the liar is not checkpointed again.
    waiting.join(10)
    assert granted and granted[0].holding
    scheduler.wait_log(r"the checkpoint of liar \(c\d+, pid \d+\) failed: .*no CUDA process.*"
                       r"it holds no GPU memory, so the GPU goes on")
    assert ask(p.PING)["op"] == p.PONG
    granted[0].close()
    liar.close()
    assert "Traceback" not in scheduler.log()


def test_a_failed_checkpoint_blocks_the_gpu_one_grace_period_at_most(
        checkpointing, workload, checkpoint_dir) -> None:
    scheduler = checkpointing("--grace", "1")
    w = kernel(workload, scheduler, checkpoint_dir, FAKE_CUDA_CHECKPOINT_FAIL="1")
    hold_with(w, scheduler, 6 * GiB)
    with next_holder_gets_the_gpu(scheduler.socket, timeout=20):
        scheduler.wait_log(r"\[ERROR\] GPU 0: the checkpoint of .* failed: .*or 1 s \(grace\) "
                           r"have passed")
        scheduler.wait_log(r"still holds the GPU after the grace period; granting again")
        assert w.process.poll() is None  # the process lives on; only its GPU time was taken
        assert checkpoint_state(scheduler, w) == "failed"
    assert scheduler.log().count("[ERROR] GPU 0: the checkpoint of") == 1
    assert "Traceback" not in scheduler.log()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to be another user")
def test_a_non_admin_reads_why_the_gpu_is_blocked_but_not_the_pid(
        checkpointing, workload, checkpoint_dir) -> None:
    scheduler = checkpointing("--grace", "30")
    Path(scheduler.socket).chmod(0o666)
    Path(scheduler.socket).parent.chmod(0o755)
    # Named: a default name ("python-<pid>") says the pid itself, to admins and others alike.
    w = kernel(workload, scheduler, checkpoint_dir, FAKE_CUDA_CHECKPOINT_FAIL="1",
               KIWI_CLIENT_NAME="notebook")
    hold_with(w, scheduler, 6 * GiB)
    with Client(scheduler.socket, name="next") as next_holder:
        next_holder.report_working_set(6 * GiB)
        next_holder.request()
        scheduler.wait_log(r"\[ERROR\] GPU 0: the checkpoint of .* failed")
        admin = status_of(scheduler)["gpus"][0]["evict_blocked"]
        public = as_user(NOBODY, lambda: Peer(scheduler.socket).request(
            {"op": p.STATUS})["status"]["gpus"][0]["evict_blocked"])
    assert f"pid {w.process.pid}" in admin
    assert public is not None and "the checkpoint of notebook (c1) failed" in public
    assert "pid" not in public and str(w.process.pid) not in public


# -- a pid taken by another user's process ----------------------------------------------------

def _connect_in_a_child_that_exits(socket_path: str, report: int, go: int) -> None:
    """As NOBODY: a child connects and registers with evict checkpoint, then exits; this
    process keeps the socket, and once told, holds the GPU with 6 GiB and leaves when dropped."""
    os.setgroups([])
    os.setgid(NOBODY)
    os.setuid(NOBODY)
    sock = socket.socket(socket.AF_UNIX)
    child = os.fork()
    if child == 0:
        try:
            sock.connect(socket_path)
            lines = sock.makefile("rb")
            sock.sendall(p.encode(p.HELLO, version=p.VERSION))
            lines.readline()
            sock.sendall(p.encode(p.REGISTER, seq=1, name="stale", evict="checkpoint"))
            registered = json.loads(lines.readline())
            me = read_identity(os.getpid())
            os.write(report, pickle.dumps((registered, me.start_time if me else None)))
        finally:
            os._exit(0)
    os.waitpid(child, 0)  # the pid is free now
    os.write(report, pickle.dumps(child))
    os.read(go, 1)
    lines = sock.makefile("rb")

    def until(op: str) -> dict:
        while True:
            message = json.loads(lines.readline())
            if message["op"] == op:
                return message

    sock.sendall(p.encode(p.ACQUIRE, seq=2))
    until(p.GRANT)
    sock.sendall(p.encode(p.WORKING_SET, seq=3, bytes=6 * GiB))
    until(p.OK)
    os.write(report, b"holding")
    until(p.DROP)
    sock.sendall(p.encode(p.RELEASE, seq=4))
    until(p.RELEASED)
    os.read(go, 1)


def _process_with_pid(pid: int, argv: list[str], env: dict[str, str],
                      after: int | None) -> subprocess.Popen:
    """Start ``argv`` as process ``pid`` (the kernel's next pid set by hand; root only), in a
    later clock tick than ``after`` (the start time of the process that had the pid). Other
    processes of the machine may take the pid first: tried again a few times.

    A pid comes round again in life only after the kernel has handed out all the others, long
    after its last process started. Set by hand it comes round at once: within one tick (10 ms)
    the two processes' start times, which /proc counts in ticks, are the same, and nothing the
    daemon reads tells them apart but the uid (it leaves the pid alone for that reason then).
    A start in the same tick is tried again, as a later tick comes."""
    for _ in range(200):
        Path("/proc/sys/kernel/ns_last_pid").write_text(str(pid - 1))
        process = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, text=True)
        started = read_identity(process.pid)
        if process.pid == pid and started is not None and started.start_time != after:
            return process
        process.kill()
        process.wait()
    pytest.skip(f"could not start a process as pid {pid} (the machine forks too much)")


@pytest.mark.skipif(os.geteuid() != 0 or not os.access("/proc/sys/kernel/ns_last_pid", os.W_OK),
                    reason="needs root to choose the next pid and to be another user")
def test_a_pid_reused_by_another_users_process_is_never_checkpointed(
        checkpointing, fake_cuda, checkpoint_dir) -> None:
    scheduler = checkpointing("--grace", "30")
    Path(scheduler.socket).chmod(0o666)
    Path(scheduler.socket).parent.chmod(0o755)
    report_r, report_w = os.pipe()
    go_r, go_w = os.pipe()
    attacker = os.fork()
    if attacker == 0:
        try:
            _connect_in_a_child_that_exits(scheduler.socket, report_w, go_r)
        finally:
            os._exit(0)
    victim = None
    try:
        with os.fdopen(report_r, "rb", buffering=0) as report:
            registered, stale_start = pickle.load(report)
            assert registered["evict"] == "checkpoint", registered
            stale_pid = pickle.load(report)
            # Root's CUDA process gets the pid the attacker's child had.
            victim = _process_with_pid(stale_pid, [
                sys.executable, "-c",
                "import ctypes, sys; ctypes.CDLL(sys.argv[1]); print('ready', flush=True); "
                "sys.stdin.read()", str(fake_cuda)],
                {**os.environ, "FAKE_CUDA_CHECKPOINT_DIR": str(checkpoint_dir)}, stale_start)
            assert victim.stdout is not None and victim.stdout.readline().strip() == "ready"
            assert driver_state(checkpoint_dir, stale_pid) == RUNNING
            os.write(go_w, b"x")
            assert report.read(7) == b"holding"
            # The attacker's quantum ends for a client that needs its room: it leaves, and the
            # daemon would checkpoint the pid it registered with.
            with next_holder_gets_the_gpu(scheduler.socket, timeout=20):
                scheduler.wait_log(rf"Leaving pid {stale_pid} alone \(stale, c\d+\): pid "
                                   rf"{stale_pid} is now another process")
                assert driver_state(checkpoint_dir, stale_pid) == RUNNING
        assert victim.poll() is None
        assert "Traceback" not in scheduler.log()
    finally:
        os.write(go_w, b"xx")
        os.waitpid(attacker, 0)
        if victim is not None:
            with contextlib.suppress(OSError):
                victim.kill()
            victim.wait()
