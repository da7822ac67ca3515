"""Who the daemon may checkpoint (nodeside.evict.policy): its own user's visible processes,
through a driver with the API; everyone else is paged as managed memory, with the reason."""

from __future__ import annotations

import os
import subprocess

from nodeside.evict import CHECKPOINT, MANAGED
from nodeside.evict.policy import cannot_act_on, choose


def test_a_process_that_asks_for_managed_gets_managed() -> None:
    assert choose(MANAGED, os.getpid(), os.getuid(), None) == (MANAGED, None)


def test_an_old_client_that_names_no_evictor_gets_managed() -> None:
    assert choose(None, os.getpid(), os.getuid(), None) == (MANAGED, None)


def test_a_visible_process_of_the_same_user_is_checkpointed() -> None:
    assert choose(CHECKPOINT, os.getpid(), os.getuid(), None) == (CHECKPOINT, None)


def test_a_driver_without_the_api_falls_back_to_managed_saying_so() -> None:
    evictor, why = choose(CHECKPOINT, os.getpid(), os.getuid(), "no cuCheckpointProcessLock")
    assert evictor == MANAGED and why == "no cuCheckpointProcessLock"


def test_a_pid_outside_the_daemon_s_namespace_falls_back_to_managed() -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()
    why = cannot_act_on(gone.pid, os.getuid())
    assert why is not None and "not visible" in why


def test_a_connection_without_peer_credentials_falls_back_to_managed() -> None:
    why = cannot_act_on(None, None)
    assert why is not None and "pid" in why


def test_another_user_s_process_needs_root_or_cap_sys_ptrace() -> None:
    why = cannot_act_on(os.getpid(), os.getuid() + 1)
    if os.geteuid() == 0:
        assert why is None  # root may act on anyone's process
    else:
        assert why is not None and "CAP_SYS_PTRACE" in why
