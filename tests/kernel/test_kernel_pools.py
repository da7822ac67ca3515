"""``%kiwi pool NAME`` against a daemon whose config names pools: a name it does not configure
is refused in one line that names the pools there are, and the kernel stays where it was.
Real kernel, real daemon."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import pytest
from kernel_support import (
    KernelUnderTest,
    entry,
    one_kernel,
    run_as_nobody,
    running_daemon,
    scheduler_status,
)
from support import DaemonProcess, scaled, short_tmpdir

from kiwi_jupyter.kernel.pool_choice import pool_note, unknown_pool

CONFIG = """\
tq: 0.2
pools:
  training: {guarantee: 0.3, weight: 1, maximum: 0.7}
  simulation: {guarantee: 0.5, weight: 3, maximum: -1}
"""


@pytest.fixture(scope="module")
def pooled_daemon() -> Iterator[DaemonProcess]:
    directory = short_tmpdir()
    (directory / "kiwi.yaml").write_text(CONFIG)
    yield from running_daemon(directory, "--config", str(directory / "kiwi.yaml"), "--grace", "60")


@pytest.fixture(scope="module")
def pooled_kernel(pooled_daemon: DaemonProcess) -> Iterator[KernelUnderTest]:
    yield from one_kernel(pooled_daemon)


def test_pool_refuses_a_name_the_scheduler_does_not_configure_and_names_its_pools(
        pooled_kernel: KernelUnderTest, pooled_daemon: DaemonProcess) -> None:
    before = entry(scheduler_status(pooled_daemon.socket), pooled_kernel.kernel_id)
    assert before is not None and before["pool"] == "default"
    cell = pooled_kernel.run("%kiwi pool trainnig")
    assert cell.status == "ok" and cell.stdout == ""
    assert cell.stderr == ("kiwi: %kiwi pool trainnig: the scheduler has no pool 'trainnig'; "
                           "its pools are: default, simulation, training (a kernel started "
                           "with KIWI_POOL=trainnig gets a pool of its own, with no guarantee)\n")
    after = entry(scheduler_status(pooled_daemon.socket), pooled_kernel.kernel_id)
    assert after is not None
    assert (after["id"], after["pool"]) == (before["id"], "default")  # not even re-registered


def test_pool_joins_a_configured_pool_and_default_again(
        pooled_kernel: KernelUnderTest, pooled_daemon: DaemonProcess) -> None:
    try:
        assert pooled_kernel.run("%kiwi pool training").stdout == \
            "kiwi: this kernel is now in pool training\n"
        row = entry(scheduler_status(pooled_daemon.socket), pooled_kernel.kernel_id)
        assert row is not None and row["pool"] == "training"
    finally:
        assert pooled_kernel.run("%kiwi pool default").stdout == \
            "kiwi: this kernel is now in pool default\n"


def test_a_daemon_that_does_not_list_its_pools_is_taken_at_its_word() -> None:
    """An older daemon's status has no configured_pools: the magic refuses nothing there."""
    assert unknown_pool({"pools": [{"name": "training"}]}, "anything") is None
    assert pool_note({"pools": []}, "anything") == ""


# A real IPython shell that becomes `nobody` before it connects, on a node whose access policy
# lets everyone use `default` and `training` only: the daemon, not the magic, refuses the rest.
ACCESS_CONFIG = CONFIG + """\
socket_mode: "0666"
access:
  default: {pools: [default, training], priorities: [NORMAL, LOW]}
"""

REFUSED_POOL = """
link = kiwi_jupyter.kernel.extension._loaded.link
link.check()
shell.run_cell("%kiwi pool simulation")
link.check()  # registered again, in its old pool
mine = [c for c in link.client.status()["clients"] if c["id"] == link.client.id]
print(json.dumps([link.client.pool, mine]), flush=True)
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to become another user")
def test_pool_the_access_policy_refuses_leaves_the_kernel_in_its_pool() -> None:
    shell = run_as_nobody(ACCESS_CONFIG, REFUSED_POOL, scaled(60))
    assert shell.returncode == 0, shell.stderr
    (refusal,) = shell.stderr.splitlines()  # one line, no traceback
    assert refusal.startswith("kiwi: could not join pool simulation: ")
    assert refusal.endswith("; this kernel stays in pool default at priority NORMAL")
    assert "simulation" in refusal.split(": ", 2)[2]  # the daemon's reason, passed on
    pool, rows = json.loads(shell.stdout)
    assert pool == "default" and [row["pool"] for row in rows] == ["default"]
