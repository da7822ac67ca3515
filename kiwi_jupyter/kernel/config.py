"""The kernel extension's settings, in one traitlets object.

Set them like any IPython option, in ``ipython_kernel_config.py`` or on the kernel's command line
(``--KiwiKernelConfig.failure_policy=fail_closed``); ``%kiwi mode`` changes ``mode`` at run time.
"""

from __future__ import annotations

from traitlets import Enum, Float, List, Unicode
from traitlets.config import Configurable

#: How a cell gets the GPU. ``eager``: the kernel acquires it before the cell's code runs.
#: ``lazy``: the CUDA shim acquires it at the cell's first GPU call (needs the shim loaded).
#: ``off``: cells are not arbitrated at all (``%kiwi acquire`` still works by hand).
MODES = ("eager", "lazy", "off")

#: Which cells wait for the GPU in eager mode: ``gpu``, those that may touch it (gpu_cells);
#: ``all``, every cell but housekeeping magics.
GATE_CELLS = ("gpu", "all")

FAIL_OPEN = "fail_open"
FAIL_CLOSED = "fail_closed"


class KiwiKernelConfig(Configurable):
    """How the Kiwi IPython extension arbitrates a kernel's cells for the GPU."""

    mode = Enum(
        MODES,
        default_value=None,
        allow_none=True,
        config=True,
        help="""How each cell gets the GPU: 'eager' acquires it before the cell runs, 'lazy'
        lets the CUDA shim acquire it at the cell's first GPU call, 'off' does not arbitrate
        cells. Unset: 'lazy' when the shim is loaded in this kernel, else 'eager'.""",
    )

    gate_cells = Enum(
        GATE_CELLS,
        default_value="gpu",
        config=True,
        help="""Eager mode: which cells wait for the GPU. 'gpu': cells that may touch it, read
        from the cell's code and what its names refer to (a GPU library imported or named, or
        an object, function or class that reaches one); cells that only define things or work
        on the CPU run at once. 'all': every cell except housekeeping magics.""",
    )

    extra_gpu_libraries = List(
        Unicode(),
        config=True,
        help="""Packages counted as GPU libraries besides the known ones (cupy, torch, jax,
        numba, tensorflow, ...): an in-house package, or a CPU stand-in in a demo.""",
    )

    failure_policy = Enum(
        (FAIL_OPEN, FAIL_CLOSED),
        default_value=FAIL_OPEN,
        config=True,
        help="""What a cell does when the Kiwi scheduler cannot be reached (not running, or
        restarting). 'fail_open' runs the cell without arbitration and says so in one line;
        'fail_closed' waits for the scheduler, with a visible line, and fails the cell after
        `unreachable_timeout` seconds.""",
    )

    unreachable_timeout = Float(
        30.0,
        min=0.0,
        config=True,
        help="""Under 'fail_closed': how long a cell waits for an unreachable scheduler before
        it fails with SchedulerUnavailable.""",
    )

    restart_grace = Float(
        5.0,
        min=0.0,
        config=True,
        help="""Under 'fail_open': a cell already waiting for the GPU when the scheduler goes
        away keeps its request for this long, in case the scheduler is only restarting, before
        it runs without arbitration.""",
    )

    reconnect_interval = Float(
        0.25,
        min=0.01,
        config=True,
        help="How often a cell waiting for an unreachable scheduler tries to reach it again.",
    )

    waiting_line_delay = Float(
        0.1,
        min=0.0,
        config=True,
        help="""A cell that has waited this long for the GPU shows the live waiting line. Shorter
        waits show nothing, so a free GPU never makes a cell's output flicker.""",
    )

    waiting_line_refresh = Float(
        0.5,
        min=0.05,
        config=True,
        help="How often the live waiting line asks the scheduler for the queue and refreshes.",
    )

    waited_note_after = Float(
        1.0,
        min=0.0,
        config=True,
        help="A cell that waited longer than this for the GPU ends with a line saying how long.",
    )
