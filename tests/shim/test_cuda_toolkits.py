"""The shim held against NVIDIA's own CUDA 12 and 13 headers and runtimes, without a GPU.

- Its replacements must have the driver's exact prototypes: the shim declares the few driver
  types itself, so the compiler checks it again against cuda.h.
- Every variant of every entry point that runs GPU work or handles GPU memory must be hooked,
  including those a new CUDA release adds (CUDA 12.8's batched copies, CUDA 13's _v2 of them).
- The real libcudart, loaded the way PyTorch and CuPy load it, must get the shim's replacement for
  each such entry point it asks the driver for, by cuGetProcAddress_v2 and per-thread flavour.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from cuda_toolkits import (
    GPU_ENTRY_POINT,
    Toolkit,
    entry_point_versions,
    runtimes,
    shim_hooks,
    superseded,
    toolkits,
)
from shim_harness import preload

from kiwi_jupyter.shim import build

HOOKS = shim_hooks(build.HERE / "hooks.h")
NO_TOOLKIT = pytest.param(
    None, marks=pytest.mark.skip(reason="no CUDA headers: the test extra installs "
                                        "nvidia-cuda-runtime-cu12 and nvidia-cuda-runtime"))


def each(found: list[Toolkit]) -> pytest.MarkDecorator:
    values = [pytest.param(t, id=t.label) for t in found] or [NO_TOOLKIT]
    return pytest.mark.parametrize("toolkit", values)


def compile_against(toolkit: Toolkit, source: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [build.compiler(), "-std=c11", "-fsyntax-only", "-DKIWI_CHECK_CUDA_H",
         f"-I{toolkit.include}", f"-I{build.HERE}", "-Wall", "-Wextra", "-Werror", str(source)],
        capture_output=True, text=True, check=False)


def test_the_table_is_read_whole() -> None:
    text = (build.HERE / "hooks.h").read_text()
    assert len(HOOKS) == text.count("    X(") > 100
    assert len({h.symbol for h in HOOKS}) == len(HOOKS)


@each(toolkits())
def test_every_replacement_has_the_drivers_prototype(toolkit: Toolkit) -> None:
    for source in (p for p in build.sources() if p.suffix == ".c"):
        result = compile_against(toolkit, source)
        assert result.returncode == 0, f"{source.name} against {toolkit.include}:\n{result.stderr}"


@each(toolkits())
def test_every_hook_is_an_entry_point_of_the_driver(toolkit: Toolkit, tmp_path: Path) -> None:
    """Each hooked symbol is one cuda.h declares (a typo would hook nothing), and each
    (base, version) row names a version cudaTypedefs.h knows for that base."""
    present = [h for h in HOOKS if h.version <= toolkit.version]
    source = tmp_path / "entry_points.c"
    source.write_text('#include "driver.h"\nvoid *const entry_points[] = {\n'
                      + "".join(f"    (void *)&{h.symbol},\n" for h in present) + "};\n")
    result = compile_against(toolkit, source)
    assert result.returncode == 0, result.stderr
    versions = entry_point_versions(toolkit.include)
    # cudaTypedefs.h spells out _ptsz versions but not _ptds ones; the runtime test covers those.
    unknown = [h for h in present
               if h.version not in versions.get(h.base, set()) and not h.symbol.endswith("_ptds")]
    assert not unknown, unknown


@each(toolkits())
def test_every_gpu_entry_point_of_the_release_is_hooked(toolkit: Toolkit) -> None:
    hooked = {(h.base, h.version) for h in HOOKS}
    gpu = {base: v for base, v in entry_point_versions(toolkit.include).items()
           if GPU_ENTRY_POINT.fullmatch(base)}
    assert {"cuMemAlloc", "cuLaunchKernel", "cuMemcpyAsync"} <= gpu.keys()
    missing = sorted((base, version) for base, versions in gpu.items() for version in versions
                     if (base, version) not in hooked and not superseded(versions, version))
    assert not missing, f"CUDA {toolkit.label} entry points the shim does not hook: {missing}"


LOAD_RUNTIME = """
import ctypes, sys
runtime = ctypes.CDLL(sys.argv[1])
count = ctypes.c_int(-1)
print(runtime.cudaGetDeviceCount(ctypes.byref(count)))
"""
REQUEST = re.compile(
    r"cuGetProcAddress symbol=(\w+) version=(\d+) flags=(\d+) found=([01]) answer=(\S+)")
HOOKED = re.compile(r"cuGetProcAddress (\w+) \((\d+), flags (\d+)\): hooked (\w+)")


@each(runtimes())
@pytest.mark.parametrize("answers", ["exported", "internal"])
def test_the_real_runtime_gets_the_shims_replacements(
        toolkit: Toolkit, answers: str, shim_library: Path, fake_cuda: Path,
        tmp_path: Path) -> None:
    """The runtime asks the driver for several hundred entry points at start-up, by base name,
    the version of each variant and the default-stream flavour. It gets no further against the
    fake driver (which lacks the runtime's private export tables), but that table is exactly
    what decides whether the GPU work of every framework on top reaches the shim.

    The driver may answer with its exported functions (the shim knows them by address) or with
    internal entry points (the shim must pick the variant by name, version and flavour): both
    must end at the replacement of the very variant the driver meant."""
    assert toolkit.runtime
    log = tmp_path / "cuda.log"
    env = {"PATH": "/usr/bin:/bin", **preload(shim_library),
           "LD_LIBRARY_PATH": str(fake_cuda.parent), "FAKE_CUDA_LOG": str(log),
           "KIWI_SHIM_LOG": "1", "KIWI_SOCKET": str(tmp_path / "no-daemon.sock")}
    if answers == "internal":
        env["FAKE_CUDA_HIDDEN_ENTRY_POINTS"] = "1"
    result = subprocess.run([sys.executable, "-c", LOAD_RUNTIME, str(toolkit.runtime)], env=env,
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert "dlsym cuGetProcAddress" in result.stderr  # the runtime fetched it through dlsym

    requests = [(s, int(v), int(f), answer) for s, v, f, found, answer
                in REQUEST.findall(log.read_text())]
    gpu = [r for r in requests if GPU_ENTRY_POINT.fullmatch(r[0])]
    assert len(requests) > 300 and len(gpu) > 50, "the runtime did not load its driver table"
    unanswered = [r for r in gpu if r[3] == "-"]
    assert not unanswered, f"the fake driver lacks entry points the runtime asks for: {unanswered}"

    hooked = {(s, int(v), int(f)): symbol for s, v, f, symbol in HOOKED.findall(result.stderr)}
    by_symbol = {h.symbol: h for h in HOOKS}
    for base, version, flags, answer in gpu:
        symbol = hooked.get((base, version, flags))
        assert symbol, f"{base} (version {version}, flags {flags}) did not reach the shim"
        if answer in by_symbol:  # the replacement of the variant the driver meant
            assert symbol == answer, (base, version, flags)
        else:  # the fake's own internal cuMemGetInfo, which has no exported twin
            hook = by_symbol[symbol]
            assert hook.base == base and hook.version <= version
    if answers == "internal":
        assert "by name" in result.stderr
