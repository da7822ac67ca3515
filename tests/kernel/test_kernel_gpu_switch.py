"""Two real Kiwi kernels on a real GPU, whose working sets do not fit together, take turns.

Skipped without a GPU (marked ``gpu``; ``make gpu-check`` runs it in its ``tests`` step), and
where the machine lacks PyTorch, NVML, ipykernel or jupyter_client. Both kernels are started
through jupyter_client with the Kiwi kernelspec (written for this interpreter into a folder of
the test's own), the shim preloaded, against a daemon in mode on that is told the GPU holds one
working set and a half (``--gpu-memory``; the kernels get the same ``KIWI_GPU_MEMORY_LIMIT``),
so each switch must evict the kernel that leaves. The real card holds both sets and headroom
(managed memory must never oversubscribe it), so an eviction that frees nothing shows in NVML.

Each kernel fills its tensor, then their cells alternate: a cell first checks that its tensor
came back as it was (a checksum per 2 MiB row), then changes it, reads NVML, and ends once the
other kernel waits for the GPU, so that its release hands over with an eviction. The test
asserts that the contents survive every switch and that NVML never shows both working sets on
the card while one kernel holds it. The report (printed, and written to ``$KIWI_GPU_REPORT_DIR``
when set, which ``make gpu-check`` includes) gives each switch's time against the floor: the
working set out and the other's in at the pinned ``cudaMemcpy`` speed of the same run.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kernel_support import KernelUnderTest, start_kernels
from support import DaemonProcess, short_tmpdir

from benchmarks.shim.evictors import pinned_floor

pytestmark = pytest.mark.gpu

GiB = 1 << 30
MiB = 1 << 20
#: Switches made; the first only evicts (the other kernel was never evicted), the rest move a
#: working set each way.
SWITCHES = 5
#: What two kernels' contexts and PyTorch's own use beside the working sets may take at most.
CONTEXTS = 2 * GiB

SETUP = """
import time, torch, pynvml
from kiwi_jupyter.shim import Shim
_shim = Shim.attach()
pynvml.nvmlInit()
_gpu = pynvml.nvmlDeviceGetHandleByIndex(0)
ROW = (2 << 20) // 8

def checksum(x):
    rows = x.view(-1, ROW).sum(dim=1)
    weights = torch.arange(1, rows.numel() + 1, device=rows.device, dtype=torch.int64)
    return int((rows * weights).sum().item())

def card_used(pid=None):
    if pid is None:
        return pynvml.nvmlDeviceGetMemoryInfo(_gpu).used
    found = [p.usedGpuMemory for p in pynvml.nvmlDeviceGetComputeRunningProcesses(_gpu)
             if p.pid == pid]
    return (found[0] or 0) if found else 0

def waits(name):
    status = get_ipython().run_line_magic('kiwi', 'status --json')
    return any(c['name'] == name and c['state'] == 'waiting' and (c['working_set'] or 0) > 0
               for c in status['clients'])
"""

FILL = """
x = torch.arange({elements}, device='cuda', dtype=torch.int64).mul_({multiplier})
x.remainder_(1 << 31)
expected = checksum(x)
torch.cuda.synchronize()
_passes = []
for _ in range(3):
    _started = time.time(); checksum(x); _passes.append(time.time() - _started)
{{'steady': min(_passes), 'evict': _shim.stats()['evict'] if _shim else None}}
"""

TURN = """
intact = checksum(x) == expected
back = time.time()
x.add_(1)
expected = checksum(x)
torch.cuda.synchronize()
card, other = card_used(), card_used({other_pid})
while {wait} and not waits({other_name!r}):
    time.sleep(0.005)
{{'intact': intact, 'back': back, 'leave': time.time(), 'card': card, 'other': other}}
"""


def nvml_memory() -> tuple[int, int, str]:
    """NVML's (used, free, name) of GPU 0, read without a CUDA context in this process."""
    import pynvml

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
    name = pynvml.nvmlDeviceGetName(handle)
    return int(memory.used), int(memory.free), name if isinstance(name, str) else name.decode()


def working_set(card_free: int) -> int:
    """4 GiB, or less where the card has less free: two sets, the contexts and 2 GiB of
    headroom must fit on it. At least 2 GiB, so that two sets on the card stand out of one
    set and the contexts."""
    size = min(4 * GiB, (card_free - CONTEXTS - 2 * GiB) // 2) // (2 * MiB) * (2 * MiB)
    if size < 2 * GiB:
        pytest.skip(f"{card_free / GiB:.1f} GiB free on the card is too little for two "
                    "working sets of 2 GiB")
    return size


@pytest.fixture
def kiwi_kernelspec(tmp_path: Path) -> list[str]:
    """The Kiwi kernelspec for this interpreter, where jupyter_client finds it (the GPU machine
    runs the repository from PYTHONPATH, with nothing installed)."""
    pytest.importorskip("ipykernel")
    pytest.importorskip("jupyter_client")
    from kiwi_jupyter.kernelspec import install

    install(prefix=str(tmp_path / "prefix"))
    return [str(tmp_path / "prefix" / "share" / "jupyter" / "kernels")]


@dataclass
class Pair:
    """Two Kiwi kernels on one card, with what was measured before they started."""

    a: KernelUnderTest
    b: KernelUnderTest
    evictor: str
    size: int  # each one's working set
    idle: int  # NVML's used memory before them
    floor: dict[str, float]  # pinned cudaMemcpy bytes/s, to_host and to_device


@pytest.fixture
def pair(kiwi_kernelspec: list[str], request: pytest.FixtureRequest) -> Iterator[Pair]:
    """Two Kiwi kernels, the shim on, KIWI_EVICT as the test's parameter, the pinned floor
    measured before they started (its buffers must not share the card with them)."""
    pytest.importorskip("torch")
    pytest.importorskip("pynvml")
    idle, free, _ = nvml_memory()
    size = working_set(free)
    floor = pinned_floor(size)
    room = size + size // 2  # one set and a half: two never fit
    daemon = DaemonProcess(short_tmpdir(), "--mode", "on", "--tq", "0.2", "--grace", "60",
                           "--gpus", "1", "--gpu-memory", str(room)).start()
    kernels: list[KernelUnderTest] = []
    try:
        kernels = start_kernels(daemon.directory, daemon.socket, 2, kernel_dirs=kiwi_kernelspec,
                                KIWI_SHIM="", KIWI_EVICT=request.param,
                                KIWI_GPU_MEMORY_LIMIT=str(room))
        yield Pair(*kernels, evictor=request.param, size=size, idle=idle, floor=floor)
    finally:
        for kernel in kernels:
            kernel.shutdown()
        daemon.cleanup()


def run(kernel: KernelUnderTest, code: str, timeout: float = 120) -> Any:
    done = kernel.run(code, timeout=timeout)
    assert done.status == "ok", f"{done.ename}: {done.reply.get('evalue')}\n{done.stderr}"
    return done.value if done.result else None


def report(evictor: str, ran_as: str, size: int, floor: dict[str, float], idle: int,
           switches: list[dict[str, Any]]) -> str:
    gpu = nvml_memory()[2]
    lines = [f"### Two Kiwi kernels taking turns: KIWI_EVICT={evictor} (ran as {ran_as}), "
             f"{size / GiB:.2f} GiB each, {gpu}, {time.strftime('%Y-%m-%d')}", "",
             f"Floor: pinned cudaMemcpy D->H {floor['to_host'] / 1e9:.1f} GB/s, H->D "
             f"{floor['to_device'] / 1e9:.1f} GB/s, same run. A switch's floor is the bytes out "
             "at the first and the bytes in at the second.", "",
             "| switch | seconds | out + in (GiB) | floor (s) | floor / seconds | card used over "
             "idle (GiB) | the idle kernel on the card, per process (GiB) | intact |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for i, s in enumerate(switches, start=1):
        moved_in = size if i > 1 else 0  # the first comes to a kernel never evicted
        ideal = size / floor["to_host"] + moved_in / floor["to_device"]
        lines.append(
            f"| {i}: {s['from']} -> {s['to']} | {s['seconds']:.3f} | "
            f"{size / GiB:.2f} + {moved_in / GiB:.2f} | {ideal:.3f} | "
            f"{ideal / s['seconds']:.2f} | {(s['card'] - idle) / GiB:.2f} | "
            f"{s['other'] / GiB:.2f} | {'yes' if s['intact'] else '**NO**'} |")
    return "\n".join(lines) + "\n"


@pytest.mark.timeout(180)
@pytest.mark.parametrize("pair", ["vmm", "auto"], indirect=True)
def test_two_kernels_that_do_not_fit_together_take_turns_and_the_idle_one_leaves_the_card(
        pair: Pair) -> None:
    a, b, size = pair.a, pair.b, pair.size
    names = {a.kernel_id: "A", b.kernel_id: "B"}
    other = {a.kernel_id: b, b.kernel_id: a}
    steady, ran_as = {}, ""
    for kernel, multiplier in ((a, 2654435761), (b, 40503)):
        run(kernel, SETUP)
        filled = run(kernel, FILL.format(elements=size // 8, multiplier=multiplier))
        steady[kernel.kernel_id], ran_as = filled["steady"], filled["evict"]
    if pair.evictor == "vmm" and ran_as != "vmm":
        pytest.skip(f"vmm: not built (the kernels' shim ran KIWI_EVICT=vmm as {ran_as})")

    def turn(kernel: KernelUnderTest, last: bool) -> str:
        """Submit kernel's next cell; all but the last end once the other kernel waits."""
        nxt = other[kernel.kernel_id]
        return kernel.submit(TURN.format(other_pid=nxt.pid, other_name=nxt.kernel_id,
                                         wait=not last))

    # Each cell is submitted while the one before it runs, so the next kernel waits when the
    # holder's cell ends: SWITCHES + 1 cells, A, B, A, ...
    holder, pending = a, turn(a, last=False)
    results = []
    for i in range(SWITCHES + 1):
        following = other[holder.kernel_id]
        waiting = turn(following, last=i == SWITCHES - 1) if i < SWITCHES else None
        done = holder.collect(pending, timeout=120)
        assert done.status == "ok", f"{done.ename}: {done.reply.get('evalue')}\n{done.stderr}"
        results.append((holder, done.value))
        if waiting is None:
            break
        holder, pending = following, waiting
    switches = [{"from": names[leaver.kernel_id], "to": names[comer.kernel_id],
                 "seconds": came["back"] - left["leave"] - steady[comer.kernel_id],
                 "card": came["card"], "other": came["other"], "intact": came["intact"]}
                for (leaver, left), (comer, came) in zip(results, results[1:], strict=False)]
    text = report(pair.evictor, ran_as, size, pair.floor, pair.idle, switches)
    print(text)
    if os.environ.get("KIWI_GPU_REPORT_DIR"):
        Path(os.environ["KIWI_GPU_REPORT_DIR"], f"two-kernels-{pair.evictor}.md").write_text(text)

    assert all(value["intact"] for _, value in results), results
    # Whoever holds, the one that left was evicted: one working set on the card.
    for switch in switches:
        assert switch["card"] - pair.idle < size + CONTEXTS, \
            f"both working sets on the card: {switches}"
