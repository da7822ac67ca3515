"""Two real kernels in eager mode sharing one GPU through a real daemon (TQ 0.2 s)."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kernel_support import Execution, Holder, KernelUnderTest, holders, start_kernels, state_of
from support import DaemonProcess, client_state, wait_for_status

# A cell that reports when its own code started and ended (the GPU is taken before the start),
# holding in between as the test says: ``work`` is a Holder's code, or a statement that ends.
TIMED = "import time as _t; _start = _t.time(); {work}; (_start, _t.time())"

#: The waiting line and its note come only after this long (KiwiKernelConfig.waited_note_after).
WAITED_NOTE_AFTER = 1.0


@pytest.fixture(scope="module")
def pair(module_daemon: DaemonProcess) -> Iterator[tuple[KernelUnderTest, KernelUnderTest]]:
    a, b = start_kernels(module_daemon.directory, module_daemon.socket, 2)
    yield a, b
    a.shutdown()
    b.shutdown()


def hold_started(socket: str, kernel: KernelUnderTest, holder: Holder) -> None:
    """Once the holding cell runs, its kernel holds the GPU (it was granted before the cell)."""
    holder.started()
    assert holders(socket) == [kernel.kernel_id]


def wait_waiting(socket: str, kernel: KernelUnderTest) -> None:
    wait_for_status(socket, lambda doc: client_state(doc, kernel.kernel_id) == "waiting",
                    what=f"{kernel.kernel_id} to wait in the queue")


# A listener on the kernel's own client: set when the daemon's drop reaches it, after the
# kernel's listener has noted why (listeners run in the order they were added).
HEAR_DROP = ("import threading as _th; from kiwi_jupyter.kernel import extension as _ke; "
             "_dropped = _th.Event(); "
             "_ke._loaded.link.add_listener("
             "lambda m: m.get('op') == 'drop' and _dropped.set())")


@pytest.fixture(scope="module")
def contention(pair: tuple[KernelUnderTest, KernelUnderTest],
               module_daemon: DaemonProcess) -> dict[str, Any]:
    """A holds the GPU until the test lets go; B asks meanwhile; then A asks again behind B.
    A lets go once B's line has been refreshed, the daemon's drop has reached A (A's quantum
    ended with B waiting), and B has waited over a second (for its closing note). The test's
    own clock marks when B could have asked at the earliest (A held) and when its cell was
    certainly waiting (its line is up), to bound B's wait by what happened, not by a guess."""
    a, b = pair
    socket = module_daemon.socket
    a.run(HEAR_DROP)
    with Holder(module_daemon.directory) as hold:
        a1 = a.submit(TIMED.format(work=f"{hold.code}; _dropped.wait(60)"))
        hold_started(socket, a, hold)
        a_held = time.time()
        b1 = b.submit(TIMED.format(work="_t.sleep(0.3)"))
        wait_waiting(socket, b)
        # The line shows once the cell itself waits (the kernel asks before it compiles it).
        b.wait_seen(b1, "display_data")
        b_waiting = time.time()
        a2 = a.submit(TIMED.format(work="_t.sleep(0.1)"))
        b.wait_seen(b1, "update_display_data")  # refreshed in place while B waits
        # A lower bound, not a race: the longer B waits, the surer its note.
        time.sleep(max(0.0, b_waiting + WAITED_NOTE_AFTER + 0.1 - time.time()))
    # A's cell ends only once the drop has reached it (the listener), however slow the daemon.
    return {"a1": a.collect(a1), "b1": b.collect(b1), "a2": a.collect(a2),
            "a": a, "b": b, "a_held": a_held, "b_waiting": b_waiting}


def texts(execution: Execution) -> list[tuple[str, str, str]]:
    """(msg_type, display_id, text) of every display and display update of a cell."""
    return [(m["header"]["msg_type"], m["content"]["transient"]["display_id"],
             m["content"]["data"].get("text/plain", ""))
            for m in execution.of_type("display_data", "update_display_data")]


def test_contending_cells_run_in_queue_order(contention: dict[str, Any]) -> None:
    a1, b1, a2 = contention["a1"].value, contention["b1"].value, contention["a2"].value
    assert a1[1] <= b1[0], "B ran while A held the GPU"
    assert b1[1] <= a2[0], "A's next cell took the GPU ahead of B, which was waiting first"


def test_waiting_line_is_one_display_updated_in_place(contention: dict[str, Any]) -> None:
    lines = texts(contention["b1"])
    assert lines[0][0] == "display_data"
    assert len({display_id for _, display_id, _ in lines}) == 1
    assert all(kind == "update_display_data" for kind, _, _ in lines[1:])
    assert len(lines) >= 3, "the line was not refreshed while B waited 1+ s"


def test_waiting_line_shows_position_holder_and_quantum(contention: dict[str, Any]) -> None:
    first = texts(contention["b1"])[0][2]
    assert first.startswith("kiwi: waiting for the GPU")
    assert "position 1 of 1 in the queue" in first
    assert f"held by kernel {contention['a'].kernel_id[:8]}" in first  # no notebook: its id
    # With a 0.2 s TQ the line may be read after A's quantum ended, while A gives back.
    assert "s left in its quantum" in first or "its quantum is over" in first


def test_waiting_line_goes_when_the_gpu_is_granted(contention: dict[str, Any]) -> None:
    lines = texts(contention["b1"])
    assert lines[-1][2] == ""
    assert all(text for _, _, text in lines[:-1])


def test_a_cell_that_waited_over_a_second_says_how_long(contention: dict[str, Any]) -> None:
    waited = re.findall(r"^kiwi: waited (\d+\.\d) s for the GPU$", contention["b1"].stdout,
                        re.MULTILINE)
    assert len(waited) == 1
    # B waited at least from when it was seen waiting until A's cell ended, and at most from
    # when A held until B's own code started; the note rounds to a tenth.
    a1_end, b1_start = contention["a1"].value[1], contention["b1"].value[0]
    assert a1_end - contention["b_waiting"] - 0.05 <= float(waited[0])
    assert float(waited[0]) <= b1_start - contention["a_held"] + 0.05
    assert "waited" not in contention["a1"].stdout


def test_a_drop_asked_mid_cell_is_honoured_at_cell_end_with_one_line(
        contention: dict[str, Any]) -> None:
    notes = [line for line in contention["a1"].stdout.splitlines() if "during this cell" in line]
    assert notes == ["kiwi: the scheduler asked for the GPU back during this cell (this "
                     "kernel's quantum ended with others waiting); it was given back when the "
                     "cell ended"]
    assert "during this cell" not in contention["a2"].stdout  # nobody waited behind it


def test_interrupt_while_waiting_withdraws_the_request(
        pair: tuple[KernelUnderTest, KernelUnderTest], module_daemon: DaemonProcess) -> None:
    a, b = pair
    socket = module_daemon.socket
    with Holder(module_daemon.directory) as hold:
        holding = a.submit(hold.code)
        hold_started(socket, a, hold)
        waiting = b.submit("reached = True")
        wait_waiting(socket, b)
        # The request goes out before the cell is compiled; interrupt only once the cell
        # itself waits (its waiting line is up), not while IPython is still compiling it.
        b.wait_seen(waiting, "display_data")

        b.interrupt()
        interrupted = b.collect(waiting)

        assert interrupted.ename == "KeyboardInterrupt"
        assert "the request was withdrawn" in interrupted.reply["evalue"]
        assert state_of(socket, b.kernel_id) == "idle"
        assert holders(socket) == [a.kernel_id]
    assert a.collect(holding).status == "ok"
    assert b.run("'reached' in globals()").value is False  # usable, and the cell never ran


def test_a_cell_that_does_not_compile_withdraws_its_request(
        pair: tuple[KernelUnderTest, KernelUnderTest], module_daemon: DaemonProcess) -> None:
    # The request goes out when the cell starts, before IPython compiles it; a cell that never
    # reaches its first statement must not stay in the queue.
    a, b = pair
    with Holder(module_daemon.directory) as hold:
        holding = a.submit(hold.code)
        hold_started(module_daemon.socket, a, hold)

        broken = b.run("x = (")

        assert broken.ename == "SyntaxError"
        assert state_of(module_daemon.socket, b.kernel_id) == "idle"
        assert holders(module_daemon.socket) == [a.kernel_id]
    assert a.collect(holding).status == "ok"
    assert holders(module_daemon.socket) == []


def test_silent_executions_never_wait_for_the_gpu(
        pair: tuple[KernelUnderTest, KernelUnderTest], module_daemon: DaemonProcess) -> None:
    a, b = pair
    with Holder(module_daemon.directory) as hold:
        holding = a.submit(hold.code)
        hold_started(module_daemon.socket, a, hold)

        # While A holds until the test lets go: a run that waited for A would never end.
        silent = b.run("silent_ran = True", silent=True)

        assert silent.status == "ok"
        assert holders(module_daemon.socket) == [a.kernel_id], "B's silent run waited for A"
        assert state_of(module_daemon.socket, b.kernel_id) == "idle"
    assert a.collect(holding).status == "ok"
    assert b.run("silent_ran").value is True


def test_a_cell_of_kiwi_magics_never_waits_for_the_gpu(
        pair: tuple[KernelUnderTest, KernelUnderTest], module_daemon: DaemonProcess) -> None:
    a, b = pair
    with Holder(module_daemon.directory) as hold:
        holding = a.submit(hold.code)
        hold_started(module_daemon.socket, a, hold)

        status = b.run("# what is going on?\n%kiwi status")  # would never end if it waited

        assert f"kernel {a.kernel_id[:8]}" in status.result["text/plain"]  # no notebook: its id
        assert holders(module_daemon.socket) == [a.kernel_id]
    assert a.collect(holding).status == "ok"


@pytest.mark.parametrize("ending, code, ename", [
    ("success", "import time; time.sleep(0.05); 1 + 1", None),
    ("error", "import time; time.sleep(0.05); 1 / 0", "ZeroDivisionError"),
])
def test_the_gpu_is_given_back_when_a_cell_ends(
        pair: tuple[KernelUnderTest, KernelUnderTest], module_daemon: DaemonProcess,
        ending: str, code: str, ename: str | None) -> None:
    a, _ = pair
    result = a.run(code)
    assert result.ename == ename
    assert holders(module_daemon.socket) == []


def test_the_gpu_is_given_back_when_a_cell_is_interrupted(
        pair: tuple[KernelUnderTest, KernelUnderTest], module_daemon: DaemonProcess) -> None:
    a, _ = pair
    with Holder(module_daemon.directory) as hold:
        running = a.submit(hold.code)
        # The daemon grants as soon as the request arrives, while IPython may still be compiling
        # the cell, where an interrupt is printed and the cell runs anyway: interrupt the cell's
        # own code.
        hold_started(module_daemon.socket, a, hold)

        a.interrupt()

        assert a.collect(running).ename == "KeyboardInterrupt"
    assert holders(module_daemon.socket) == []
    assert a.run("2 + 2").value == 4


def test_a_value_the_shell_displays_is_still_displayed(
        pair: tuple[KernelUnderTest, KernelUnderTest]) -> None:
    # The gate joins a cell's first statement unless IPython would display that statement.
    a, _ = pair
    a.run("%config InteractiveShell.ast_node_interactivity = 'last_expr_or_assign'")
    try:
        assert a.run("y = 6 * 7").value == 42
    finally:
        a.run("%config InteractiveShell.ast_node_interactivity = 'last_expr'")
    assert a.run("z = 1\n2 * 3").value == 6


def test_an_error_in_the_first_statement_is_reported_as_usual(
        pair: tuple[KernelUnderTest, KernelUnderTest], module_daemon: DaemonProcess) -> None:
    a, _ = pair
    failed = a.run("no_such_name\nafter = True")
    assert failed.ename == "NameError"
    assert "no_such_name" in "\n".join(failed.reply["traceback"])
    assert holders(module_daemon.socket) == []
    assert a.run("'after' in globals()").value is False


@pytest.fixture
def gpu_cells_only(pair: tuple[KernelUnderTest, KernelUnderTest]) -> Iterator[KernelUnderTest]:
    """B with the kernel's default rule: only cells that may touch the GPU wait for it. ``json``
    stands in for a GPU library (none is installed here)."""
    _, b = pair
    b.run("%config KiwiKernelConfig.gate_cells = 'gpu'")
    b.run("%config KiwiKernelConfig.extra_gpu_libraries = ['json']")
    yield b
    b.run("%config KiwiKernelConfig.gate_cells = 'all'")
    b.run("%config KiwiKernelConfig.extra_gpu_libraries = []")


def test_in_eager_mode_a_cell_that_only_defines_functions_does_not_wait_for_the_gpu(
        pair: tuple[KernelUnderTest, KernelUnderTest], module_daemon: DaemonProcess,
        gpu_cells_only: KernelUnderTest) -> None:
    a, b = pair
    with Holder(module_daemon.directory) as hold:
        holding = a.submit(hold.code)
        hold_started(module_daemon.socket, a, hold)

        # While A holds until the test lets go: a cell that waited for A would never end.
        defined = b.run("def encode(rows):\n    import json\n    return json.dumps(rows)\n")

        assert defined.status == "ok"
        assert not defined.of_type("display_data"), "the cell showed a waiting line"
        assert holders(module_daemon.socket) == [a.kernel_id], "B's cell waited for A"
        assert state_of(module_daemon.socket, b.kernel_id) == "idle"
    assert a.collect(holding).status == "ok"


def test_in_eager_mode_a_cell_that_calls_into_a_gpu_library_waits_for_the_gpu(
        pair: tuple[KernelUnderTest, KernelUnderTest], module_daemon: DaemonProcess,
        gpu_cells_only: KernelUnderTest) -> None:
    a, b = pair
    b.run("def encode(rows):\n    import json\n    return json.dumps(rows)\n")
    with Holder(module_daemon.directory) as hold:
        holding = a.submit(hold.code)
        hold_started(module_daemon.socket, a, hold)

        calling = b.submit("encode([1, 2])")
        wait_waiting(module_daemon.socket, b)
    a_done = a.collect(holding)
    called = b.collect(calling)

    assert a_done.status == "ok"
    assert called.result["text/plain"] == "'[1, 2]'"
    assert holders(module_daemon.socket) == []
