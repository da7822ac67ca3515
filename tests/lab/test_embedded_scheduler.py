"""The embedded scheduler: started when no daemon answers, given to kernels, restarted when it
dies, stopped with the server."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from kiwiserver import get_status, kiwi_app, kiwi_config
from support import DaemonProcess, scaled

from kiwi_jupyter.server.embedded import daemon_answers
from nodeside.client import discovery
from nodeside.protocol import DEFAULT_SOCKET


async def wait_until(predicate: Any, timeout: float = 15.0, what: str = "condition") -> None:
    deadline = time.monotonic() + scaled(timeout)
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


class TestWhenNoDaemonAnswers:
    @pytest.fixture
    def jp_server_config(self, nowhere: str) -> dict:
        return kiwi_config(tq=7.5, mode="auto")

    async def test_the_server_starts_its_own_scheduler(
        self, jp_serverapp: Any, jp_fetch: Any, nowhere: str
    ) -> None:
        embedded = kiwi_app(jp_serverapp).embedded
        assert embedded is not None and embedded.running
        status = await get_status(jp_fetch)
        assert status["reachable"] is True
        assert status["socket"] == embedded.socket_path != nowhere

    async def test_its_options_reach_the_scheduler(self, jp_fetch: Any) -> None:
        status = await get_status(jp_fetch)
        assert (status["mode"], status["tq"]) == ("auto", 7.5)

    async def test_kernels_are_told_the_folder_it_serves_to_name_their_notebooks(
        self, jp_serverapp: Any
    ) -> None:
        assert os.environ["KIWI_NOTEBOOK_ROOT"] == os.path.abspath(jp_serverapp.root_dir)
        await kiwi_app(jp_serverapp).stop_extension()
        assert "KIWI_NOTEBOOK_ROOT" not in os.environ

    async def test_its_socket_is_private_to_this_server(self, jp_serverapp: Any) -> None:
        directory = os.path.dirname(kiwi_app(jp_serverapp).embedded.socket_path)
        assert os.stat(directory).st_mode & 0o077 == 0

    async def test_kernels_the_server_starts_use_it(self, jp_serverapp: Any, jp_fetch: Any) -> None:
        # A real kernel connects with the real Client through KIWI_SOCKET alone, and registers
        # under its kernel id, as the kernel extension does; the status then shows it holding.
        kernel_manager = jp_serverapp.kernel_manager
        kernel_id = await kernel_manager.start_kernel()
        client = kernel_manager.get_kernel(kernel_id).client()
        client.start_channels()
        try:
            await client.wait_for_ready(timeout=60)
            code = (
                "from nodeside.client import Client\n"
                f"kiwi = Client(name={kernel_id!r})\n"
                "kiwi.acquire(timeout=20)\n"
            )
            reply = await client.execute(code, reply=True, timeout=60)
            assert reply["content"]["status"] == "ok", reply["content"]
            status = await get_status(jp_fetch)
            (holder,) = status["clients"]
            assert (holder["name"], holder["state"]) == (kernel_id, "holding")
        finally:
            client.stop_channels()
            await kernel_manager.shutdown_kernel(kernel_id, now=True)

    async def test_it_is_restarted_when_it_dies(self, jp_serverapp: Any, jp_fetch: Any) -> None:
        # What `jupyter lab` does once its event loop runs (pytest-jupyter leaves it out):
        # start the extensions' background tasks, our watcher among them.
        await jp_serverapp._post_start()
        embedded = kiwi_app(jp_serverapp).embedded
        first = embedded.pid
        os.kill(first, signal.SIGKILL)
        await wait_until(
            lambda: embedded.pid != first and embedded.running,
            what="a new scheduler process",
        )
        await wait_until(lambda: daemon_answers(embedded.socket_path), what="it to answer")
        assert embedded.restarts == 1
        assert (await get_status(jp_fetch))["reachable"] is True

    async def test_what_was_set_in_the_panel_survives_its_restart(
        self, jp_serverapp: Any, jp_fetch: Any
    ) -> None:
        await jp_serverapp._post_start()
        embedded = kiwi_app(jp_serverapp).embedded
        changed = await jp_fetch("kiwi", "api", "scheduler", method="POST",
                                 body=json.dumps({"mode": "on", "tq": 3.25}))
        assert changed.code == 200
        first = embedded.pid
        os.kill(first, signal.SIGKILL)
        await wait_until(lambda: embedded.pid != first and embedded.running,
                         what="a new scheduler process")
        await wait_until(lambda: daemon_answers(embedded.socket_path), what="it to answer")
        status = await get_status(jp_fetch)
        assert (status["mode"], status["tq"]) == ("on", 3.25)

    async def test_it_keeps_its_state_in_the_servers_runtime_dir_while_the_server_runs(
        self, jp_serverapp: Any, jp_fetch: Any
    ) -> None:
        extension = kiwi_app(jp_serverapp)
        state_file = extension.embedded.state_file
        assert state_file.parent == Path(jp_serverapp.runtime_dir)
        await jp_fetch("kiwi", "api", "scheduler", method="POST", body=json.dumps({"tq": 4}))
        assert json.loads(state_file.read_text())["tq"] == 4
        await extension.stop_extension()
        assert not state_file.exists()

    async def test_it_stops_with_the_server(self, jp_serverapp: Any, nowhere: str) -> None:
        extension = kiwi_app(jp_serverapp)
        embedded = extension.embedded
        pid, socket_path = embedded.pid, embedded.socket_path
        await extension.stop_extension()
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
        assert not os.path.exists(os.path.dirname(socket_path))
        # The server's environment is as it was before the server started.
        assert os.environ["KIWI_SOCKET"] == nowhere


    async def test_its_socket_is_published_where_kiwictl_looks(self, jp_serverapp: Any) -> None:
        if discovery.is_socket(DEFAULT_SOCKET):
            pytest.skip(f"a node daemon listens at {DEFAULT_SOCKET} here; kiwictl would use it")
        embedded = kiwi_app(jp_serverapp).embedded
        assert embedded.published == discovery.published_socket_path()
        assert os.readlink(embedded.published) == embedded.socket_path
        env = {k: v for k, v in os.environ.items() if k != "KIWI_SOCKET"}
        kiwictl = await asyncio.to_thread(
            subprocess.run, [sys.executable, "-m", "nodeside.ctl", "status", "--json"],
            capture_output=True, text=True, timeout=60, env=env)
        assert kiwictl.returncode == 0, kiwictl.stderr

    async def test_the_published_socket_goes_with_the_server(self, jp_serverapp: Any) -> None:
        extension = kiwi_app(jp_serverapp)
        published = extension.embedded.published
        assert published is not None
        await extension.stop_extension()
        assert not os.path.lexists(published)


class TestWhenItCannotStart:
    """An option the scheduler refuses: its command line is wrong."""

    @pytest.fixture
    def jp_server_config(self, nowhere: str) -> dict:
        return kiwi_config(scheduler_args=["--gpu-memory", "lots"])

    async def test_the_status_says_why_in_the_schedulers_own_words(self, jp_fetch: Any) -> None:
        status = await get_status(jp_fetch)
        assert status["reachable"] is False
        assert "the embedded scheduler could not start" in status["reason"]
        assert "argument --gpu-memory: not a size: 'lots'" in status["reason"]

    async def test_the_extension_still_serves_the_panel(self, jp_serverapp: Any) -> None:
        extension = kiwi_app(jp_serverapp)
        assert extension.embedded_failure is not None
        assert extension.link is not None and extension.watch is not None

    async def test_it_is_not_started_again_with_the_same_bad_arguments(
        self, jp_serverapp: Any
    ) -> None:
        await jp_serverapp._post_start()
        extension = kiwi_app(jp_serverapp)
        assert extension._watcher is None
        assert extension.embedded.restarts == 0

    async def test_the_server_stops(self, jp_serverapp: Any, nowhere: str) -> None:
        extension = kiwi_app(jp_serverapp)
        directory = os.path.dirname(extension.embedded.socket_path)
        await extension.stop_extension()
        assert not os.path.exists(directory)
        assert os.environ["KIWI_SOCKET"] == nowhere


class TestWhenADaemonAnswers:
    @pytest.fixture
    def jp_server_config(self, kiwi_daemon: DaemonProcess, monkeypatch: pytest.MonkeyPatch) -> dict:
        monkeypatch.setenv("KIWI_SOCKET", kiwi_daemon.socket)
        return kiwi_config()

    async def test_the_server_uses_it_and_starts_none(
        self, jp_serverapp: Any, jp_fetch: Any, kiwi_daemon: DaemonProcess
    ) -> None:
        assert kiwi_app(jp_serverapp).embedded is None
        status = await get_status(jp_fetch)
        assert (status["reachable"], status["socket"]) == (True, kiwi_daemon.socket)
        assert not os.path.lexists(discovery.published_socket_path())  # nothing to publish


class TestWhenTurnedOff:
    @pytest.fixture
    def jp_server_config(self, nowhere: str) -> dict:
        return kiwi_config(embedded_scheduler=False)

    async def test_no_scheduler_is_started_and_the_status_says_so(
        self, jp_serverapp: Any, jp_fetch: Any
    ) -> None:
        assert kiwi_app(jp_serverapp).embedded is None
        assert (await get_status(jp_fetch))["reachable"] is False


@pytest.mark.parametrize("written", [
    ['--KiwiExtension.scheduler_args=["--gpu-memory", "16GiB"]'],  # in a shell's single quotes
    ["--KiwiExtension.scheduler_args=[--gpu-memory,16GiB]"],  # a shell took the quotes off
    ["--KiwiExtension.scheduler_args=['--gpu-memory', '16GiB']"],
    ["--KiwiExtension.scheduler_args=--gpu-memory", "--KiwiExtension.scheduler_args=16GiB"],
])
def test_a_list_of_scheduler_arguments_reads_as_written_on_a_command_line(
        written: list[str]) -> None:
    """Jupyter's command line gives an extension's list option written out as one string."""
    from jupyter_server.serverapp import ServerApp

    from kiwi_jupyter.server.app import KiwiExtension

    server = ServerApp()
    try:
        server.parse_command_line(written)
        assert KiwiExtension(config=server.config).scheduler_args == ["--gpu-memory", "16GiB"]
    finally:
        ServerApp.clear_instance()


def test_embedded_scheduler_is_off_by_default_inside_kubernetes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from kiwi_jupyter.server.app import KiwiExtension

    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    assert KiwiExtension().embedded_scheduler is False
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST")
    assert KiwiExtension().embedded_scheduler is True


def _jupyter_server(tmp_path: Any, nowhere: str, *options: str) -> subprocess.Popen[str]:
    """A real ``jupyter server`` (its own process, as ``jupyter lab`` runs), its runtime files
    in ``tmp_path/runtime``, with nothing answering at KIWI_SOCKET."""
    runtime = tmp_path / "runtime"
    env = {**os.environ, "XDG_RUNTIME_DIR": str(runtime), "JUPYTER_RUNTIME_DIR": str(runtime),
           "KIWI_SOCKET": nowhere}
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return subprocess.Popen(
        [sys.executable, "-m", "jupyter", "server", "--no-browser", "--ip=127.0.0.1",
         f"--port={port}", "--ServerApp.port_retries=0", "--ServerApp.token=kiwi-test",
         f"--ServerApp.root_dir={tmp_path}", *(["--allow-root"] if os.getuid() == 0 else []),
         *options],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        env=env,
    )


def _started(server: subprocess.Popen[str]) -> tuple[str | None, list[str]]:
    """Read the server's log until it runs: the embedded scheduler's socket (None: none
    started) and the lines read."""
    assert server.stderr is not None
    socket_path, lines = None, []
    for line in server.stderr:  # ends when the server exits, so a failed start fails here
        lines.append(line)
        found = re.search(r"embedded scheduler listening on (\S+)", line)
        socket_path = found.group(1) if found else socket_path
        if "is running at" in line:
            break
    return socket_path, lines


def test_a_server_whose_scheduler_cannot_start_stops_on_sigterm(
    tmp_path: Any, nowhere: str
) -> None:
    """The scheduler refuses an option: the server runs on (the panel says why), and SIGTERM
    ends it as any server."""
    server = _jupyter_server(tmp_path, nowhere, '--KiwiExtension.scheduler_args=["--gpu-memory",'
                             ' "lots"]')
    try:
        socket_path, lines = _started(server)
        assert socket_path is None
        assert any("could not start" in line and "not a size" in line for line in lines), \
            "".join(lines)
        server.send_signal(signal.SIGTERM)
        rest = server.communicate(timeout=scaled(60))[1]
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
            pytest.fail("the server did not stop on SIGTERM")
    assert "Traceback" not in rest, rest
    assert list((tmp_path / "runtime").glob("kiwi-scheduler-*.json")) == [], rest


def test_a_server_interrupted_without_a_terminal_leaves_no_folder_or_link(
    tmp_path: Any, nowhere: str
) -> None:
    """Without a terminal, Ctrl-C (SIGINT) ends `jupyter lab` by KeyboardInterrupt, which skips
    the extensions' own stop (as in `make lab` run from a script, or a container without -t):
    the scheduler's private folder and the link published for kiwictl must go all the same."""
    runtime = tmp_path / "runtime"
    server = _jupyter_server(tmp_path, nowhere)
    try:
        socket_path, _ = _started(server)
        assert socket_path is not None, "the server started no embedded scheduler"
        published = runtime / "kiwi" / "scheduler.sock"
        assert os.readlink(published) == socket_path
        server.send_signal(signal.SIGINT)
        rest = server.communicate(timeout=scaled(60))[1]
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    assert not os.path.exists(os.path.dirname(socket_path)), rest
    assert not os.path.lexists(published), rest
    assert list(runtime.glob("kiwi-scheduler-*.json")) == [], rest
