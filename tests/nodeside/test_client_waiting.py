"""A caller blocked in acquire reads the client's socket itself; nothing else may notice.

While it waits, the connection thread stands aside: replies to the client's other threads,
events for its listeners and an interrupt must all behave as when that thread reads.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
from typing import Any

from support import DaemonProcess, client_state, scaled, wait_for_status

from nodeside.client import Client

INTERRUPTED_WAITER = textwrap.dedent("""
    import sys
    from nodeside.client import Client
    c = Client(name="waiter")
    c.ping()
    print("ready", flush=True)
    try:
        c.acquire(timeout=30)
        print("granted?!", flush=True)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
    sys.stdin.readline()
    c.acquire(timeout=10)
    print("holding", flush=True)
    sys.stdin.readline()
""")


def state_of(client: Client, name: str) -> str | None:
    return next((c["state"] for c in client.status()["clients"] if c["name"] == name), None)


def test_while_a_caller_waits_other_threads_get_replies_and_listeners_get_events(
        daemon: DaemonProcess) -> None:
    with Client(daemon.socket, name="holder") as holder, \
            Client(daemon.socket, name="waiter") as waiter:
        holder.acquire(timeout=5)
        events: list[dict[str, Any]] = []
        told_mode = threading.Event()

        def hear(event: dict[str, Any]) -> None:
            events.append(event)
            if event.get("op") == "mode":
                told_mode.set()

        waiter.add_listener(hear)
        outcome: list[BaseException | None] = []

        def wait_for_the_gpu() -> None:
            try:
                waiter.acquire(timeout=20)
                outcome.append(None)
            except BaseException as exc:  # handed to the test's thread
                outcome.append(exc)

        thread = threading.Thread(target=wait_for_the_gpu)
        thread.start()
        wait_for_status(daemon.socket, lambda doc: client_state(doc, "waiter") == "waiting",
                        what="the waiter to queue")

        # The waiting thread holds the socket: these replies reach us through it.
        assert state_of(waiter, "waiter") == "waiting"
        assert waiter.ping() > 0

        holder.set_mode("off")  # every request is granted at once, and every client told
        thread.join(timeout=10)
        assert outcome == [None]
        assert waiter.holding
        assert told_mode.wait(scaled(10)), f"no mode event among {events}"

        # The connection thread has the socket back: events while holding still arrive.
        holder.set_mode("on")
        assert waiter.drop_requested.wait(scaled(10)), "no drop request"


def test_ctrl_c_while_waiting_withdraws_the_request_and_the_client_goes_on(
        start_daemon) -> None:
    # A quantum far longer than the test: the holder keeps the GPU, so the request is still
    # waiting when the interrupt comes, however slow the machine.
    daemon = start_daemon("--tq", "60", "--grace", "60")
    with Client(daemon.socket, name="holder") as holder:
        holder.acquire(timeout=5)
        proc = subprocess.Popen([sys.executable, "-c", INTERRUPTED_WAITER], text=True,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                env={**os.environ, "KIWI_SOCKET": daemon.socket})
        assert proc.stdin is not None and proc.stdout is not None
        try:
            assert proc.stdout.readline().strip() == "ready"
            wait_for_status(daemon.socket, lambda doc: client_state(doc, "waiter") == "waiting",
                        what="the waiter to queue")

            proc.send_signal(signal.SIGINT)
            assert proc.stdout.readline().strip() == "interrupted"
            try:
                wait_for_status(daemon.socket, lambda doc: client_state(doc, "waiter") == "idle",
                                what="the request to be withdrawn")
            except AssertionError as failed:
                # Seen once in a full run beside stress-ng, never alone: say what was left.
                waiters = [(c["id"], c["state"]) for c in holder.status()["clients"]
                           if c["name"] == "waiter"]
                raise AssertionError(f"{failed}; the daemon lists {waiters}; its log ends:\n"
                                     f"{daemon.log()[-3000:]}") from None
            holder.release()
            assert state_of(holder, "waiter") == "idle"  # nobody was granted behind our back

            proc.stdin.write("go\n")
            proc.stdin.flush()
            assert proc.stdout.readline().strip() == "holding"
            assert state_of(holder, "waiter") == "holding"
        finally:
            proc.kill()
            proc.wait()
