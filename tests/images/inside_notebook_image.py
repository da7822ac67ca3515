"""Runs inside the notebook image (test_notebook_image.py), as the notebook's user.

Lists the kernels and extensions as Jupyter sees them, then starts JupyterLab as Kubeflow's
notebook service does (no token, under NB_PREFIX), on a free port, and asks it for the Kiwi
status and for its kernelspecs. Prints one JSON object: what each answered.

    python3 inside_notebook_image.py TIMEOUT
"""

from __future__ import annotations

import json
import os
import queue
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request


def lines_of(stream) -> queue.Queue[str | None]:
    """The stream's lines as they come, on a queue (None at its end)."""
    lines: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        for line in stream:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    return lines


def wait_for_line(lines: queue.Queue[str | None], pattern: str, timeout: float,
                  seen: list[str]) -> re.Match[str]:
    """The first line matching pattern (the lines read are added to seen); fails when the
    stream ends or nothing comes within the timeout."""
    while True:
        line = lines.get(timeout=timeout)
        if line is None:
            raise RuntimeError(f"ended before a line matched {pattern!r}:\n" + "".join(seen))
        seen.append(line)
        found = re.search(pattern, line)
        if found:
            return found


def jupyter(*argv: str, timeout: float) -> str:
    done = subprocess.run(["jupyter", *argv], capture_output=True, text=True, timeout=timeout)
    return done.stdout + done.stderr


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def get(url: str, timeout: float) -> object:
    with urllib.request.urlopen(url, timeout=timeout) as answer:
        return json.load(answer)


def first_answer(url: str, server: subprocess.Popen[str], timeout: float) -> object:
    """GET url once the server listens. Jupyter Server says where it runs before its event loop
    binds the port, so the first connections may be refused; retried until the deadline, or
    until the server has exited."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return get(url, timeout)
        except urllib.error.URLError as error:
            refused = isinstance(error.reason, ConnectionRefusedError)
            if not refused or server.poll() is not None or time.monotonic() > deadline:
                raise
        time.sleep(0.05)


def stop(server: subprocess.Popen[str], timeout: float) -> None:
    """SIGTERM, as Kubernetes stops a pod, and SIGKILL if the server does not end in time."""
    server.terminate()
    try:
        server.wait(timeout)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait(timeout)
        raise


def main(timeout: float) -> dict[str, object]:
    seen = {"kernelspecs": json.loads(jupyter("kernelspec", "list", "--json", timeout=timeout)),
            "server_extensions": jupyter("server", "extension", "list", timeout=timeout),
            "lab_extensions": jupyter("labextension", "list", timeout=timeout)}
    prefix = os.environ.get("NB_PREFIX", "/")
    # Kubeflow's jupyterlab service, but on loopback and a free port: the machine is shared.
    server = subprocess.Popen(
        ["jupyter", "lab", f"--notebook-dir={os.environ['HOME']}", "--ip=127.0.0.1",
         "--no-browser", f"--port={free_port()}", "--ServerApp.token=", "--ServerApp.password=",
         "--ServerApp.allow_origin=*", f"--ServerApp.base_url={prefix}"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        cwd=os.environ["HOME"])
    log: list[str] = []
    try:
        lines = lines_of(server.stderr)
        wait_for_line(lines, r"Kiwi: embedded scheduler listening on", timeout, log)
        url = wait_for_line(lines, r"(http://(?:127\.0\.0\.1|localhost):\d+/\S*?)lab\b", timeout,
                            log)[1]
        seen["kiwi_status"] = first_answer(f"{url}kiwi/api/status", server, timeout)
        seen["api_kernelspecs"] = get(f"{url}api/kernelspecs", timeout)
        seen["url"] = url
    except Exception as error:
        raise RuntimeError(f"{error}: the server said:\n" + "".join(log)) from error
    finally:
        stop(server, timeout)
    seen["server_log"] = "".join(log)
    return seen


if __name__ == "__main__":
    print(json.dumps(main(float(sys.argv[1]))))
