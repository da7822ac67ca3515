"""The real CUDA runtimes and headers the shim's tests hold it against, without a GPU.

NVIDIA publishes each CUDA runtime as a small wheel (``nvidia-cuda-runtime-cu12``, and
``nvidia-cuda-runtime`` for CUDA 13) holding ``libcudart`` and the toolkit's headers, among them
``cuda.h`` and ``cudaTypedefs.h``. The test extra installs both, so CI checks the shim against the
runtimes that PyTorch and CuPy wheels load; a local CUDA toolkit is checked as well when present.
"""

from __future__ import annotations

import importlib.util
import os
import re
from dataclasses import dataclass
from pathlib import Path

#: (package, libcudart name) for each runtime wheel.
WHEELS = [("nvidia.cuda_runtime", "libcudart.so.12"), ("nvidia.cu13", "libcudart.so.13")]


@dataclass(frozen=True)
class Toolkit:
    where: Path
    include: Path
    runtime: Path | None  # libcudart, where this toolkit has one

    @property
    def version(self) -> int:
        """CUDA_VERSION from cuda.h: 1000 * major + 10 * minor, as cuGetProcAddress counts."""
        match = re.search(r"#define CUDA_VERSION (\d+)", (self.include / "cuda.h").read_text())
        assert match, f"no CUDA_VERSION in {self.include / 'cuda.h'}"
        return int(match.group(1))

    @property
    def label(self) -> str:
        return f"cuda{self.version // 1000}.{self.version % 1000 // 10}"


def _wheel(package: str, library: str) -> Toolkit | None:
    try:
        spec = importlib.util.find_spec(package)
    except ModuleNotFoundError:
        return None
    if not spec or not spec.submodule_search_locations:
        return None
    root = Path(next(iter(spec.submodule_search_locations)))
    if not (root / "include" / "cuda.h").is_file():
        return None
    runtime = root / "lib" / library
    return Toolkit(root, root / "include", runtime if runtime.is_file() else None)


def _local() -> Toolkit | None:
    root = Path(os.environ.get("CUDA_HOME") or "/usr/local/cuda")
    if not (root / "include" / "cuda.h").is_file():
        return None
    runtimes = sorted((root / "lib64").glob("libcudart.so.[0-9]*"))
    return Toolkit(root, root / "include", runtimes[0] if runtimes else None)


def toolkits() -> list[Toolkit]:
    found = [t for t in (*(_wheel(p, lib) for p, lib in WHEELS), _local()) if t]
    unique: dict[Path, Toolkit] = {}
    for t in found:
        unique.setdefault(t.include.resolve(), t)
    return list(unique.values())


def runtimes() -> list[Toolkit]:
    return [t for t in toolkits() if t.runtime]


@dataclass(frozen=True)
class Hook:
    symbol: str
    base: str
    version: int
    per_thread: bool


def shim_hooks(hooks_h: Path, table: str = "") -> list[Hook]:
    """The shim's hook table, read from hooks.h's X(symbol, "base", version, per_thread) rows;
    only those of one list (KIWI_GATED_HOOKS, ...) when table names it."""
    text = hooks_h.read_text()
    if table:
        text = text.split(f"#define {table}(X)", 1)[1].split("#define", 1)[0]
    rows = re.findall(r'X\((\w+), "(\w+)", (\d+), ([01])\)', text)
    return [Hook(s, b, int(v), p == "1") for s, b, v, p in rows]


def entry_point_versions(include: Path) -> dict[str, set[int]]:
    """Each driver entry point's versions, from cudaTypedefs.h: PFN_cuMemAlloc_v3020 and
    PFN_cuMemAlloc_v2000 give {"cuMemAlloc": {2000, 3020}}."""
    text = (include / "cudaTypedefs.h").read_text()
    versions: dict[str, set[int]] = {}
    for base, version in re.findall(r"\bPFN_(cu\w+?)_v(\d+)(?:_pts[dz])?\)", text):
        versions.setdefault(base, set()).add(int(version))
    return versions


#: The entry points that put work on the GPU, move memory onto it, or allocate or report its
#: memory: every variant of these must reach the shim. Not among them: host allocations
#: (cuMemAllocHost), cuLaunchHostFunc (runs on the CPU) and cuMemDiscardBatchAsync (drops pages,
#: moves nothing).
GPU_ENTRY_POINT = re.compile(
    r"cu(Memcpy\w*|Memset\w+|Launch|LaunchGrid|LaunchGridAsync|LaunchKernel|LaunchKernelEx"
    r"|LaunchCooperativeKernel|LaunchCooperativeKernelMultiDevice|GraphLaunch"
    r"|MemPrefetch\w*|MemDiscardAndPrefetchBatchAsync"
    r"|MemAlloc|MemAllocPitch|MemAllocAsync|MemAllocFromPoolAsync|MemAllocManaged"
    r"|MemFree|MemFreeAsync|MemGetInfo|MemCreate|MemRelease"
    r"|StreamWriteValue32|StreamWriteValue64|StreamWaitValue32|StreamWaitValue64"
    r"|StreamBatchMemOp)")


def superseded(versions: set[int], version: int) -> bool:
    """The 32-bit entry points of CUDA 2.x and 3.0 (cuMemAlloc_v2000, cuMemcpyDtoDAsync_v3000)
    that CUDA 3.2's 64-bit _v2 variants replaced; no 64-bit runtime has asked for them since."""
    return version < 3020 and 3020 in versions
