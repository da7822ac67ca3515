"""The shim library: built into the package, found by `python -m kiwi_jupyter.shim path`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import shim_harness

from kiwi_jupyter.shim import build

API = ["kiwi_shim_active", "kiwi_shim_cell_begin", "kiwi_shim_acquire", "kiwi_shim_release",
       "kiwi_shim_holding", "kiwi_shim_set_policy", "kiwi_shim_stats_json",
       "kiwi_shim_catch_interrupts", "kiwi_shim_interrupt", "kiwi_shim_free_ranges_begin",
       "kiwi_shim_set_free_ranges"]
#: The conformance entry points the protocol's transcripts drive (docs/protocol.md): in a test
#: build only (tests/protocol/conformance.c), never in the library the wheel ships.
CONFORMANCE = ["kiwi_conformance_reset", "kiwi_conformance_call", "kiwi_conformance_receive",
               "kiwi_conformance_sent", "kiwi_hold_state", "kiwi_conformance_position",
               "kiwi_conformance_paused"]
CONFORMANCE_C = Path(__file__).resolve().parents[1] / "protocol" / "conformance.c"


def exported(library: Path) -> set[str]:
    out = subprocess.run(["nm", "-D", "--defined-only", str(library)], check=True,
                         capture_output=True, text=True).stdout
    return {line.split()[-1] for line in out.splitlines() if line.strip()}


def test_path_command_prints_the_built_library() -> None:
    out = subprocess.run([sys.executable, "-m", "kiwi_jupyter.shim", "path"], check=True,
                         capture_output=True, text=True).stdout.strip()
    library = Path(out)
    assert library.is_file()
    assert library.read_bytes()[:4] == b"\x7fELF"
    assert build.is_current(library)


def test_library_exports_the_api_the_driver_hooks_and_dlsym_only(shim_library: Path) -> None:
    symbols = exported(shim_library)
    own = set(API)
    assert own <= symbols
    assert {"dlsym", "cuGetProcAddress", "cuGetProcAddress_v2", "cuMemAlloc_v2",
            "cuLaunchKernel", "cuLaunchKernelEx", "cuGraphLaunch"} <= symbols
    internal = {s for s in symbols if s.startswith("kiwi_") and s not in own}
    assert not internal, f"internal functions leak out: {internal}"
    assert all(s in own or s == "dlsym" or s.startswith("cu") for s in symbols)


def test_the_packaged_library_carries_nothing_test_only() -> None:
    # The library the wheel installs, built as the wheel's hook builds it (from the shim's
    # sources alone): the conformance entry points are a test build's, and no C file of the
    # tests' is among the sources.
    from kiwi_jupyter.shim import library_path

    symbols = exported(library_path())
    assert not {s for s in symbols if s in CONFORMANCE or s.startswith("kiwi_conformance")}
    assert not [p for p in build.sources() if "conformance" in p.name]


def test_library_is_hardened_and_needs_only_libc(shim_library: Path) -> None:
    if shim_harness.SANITIZER_RUNTIME is not None:
        pytest.skip("the sanitized build links the sanitizers' runtimes and drops FORTIFY")
    dynamic = subprocess.run(["readelf", "-d", "-W", str(shim_library)], check=True,
                             capture_output=True, text=True).stdout
    needed = {line.split("[")[1].rstrip("]") for line in dynamic.splitlines() if "NEEDED" in line}
    assert needed <= {"libc.so.6", "libdl.so.2", "libpthread.so.0"}
    assert "BIND_NOW" in dynamic or "NOW" in dynamic
    segments = subprocess.run(["readelf", "-l", "-W", str(shim_library)], check=True,
                              capture_output=True, text=True).stdout
    assert "GNU_RELRO" in segments
    stack = [line for line in segments.splitlines() if "GNU_STACK" in line]
    assert stack and "RWE" not in stack[0]


def test_sources_compile_without_a_single_warning(tmp_path: Path) -> None:
    # The test build's too: with the conformance entry points (tests/protocol/conformance.c).
    c_files = [str(p) for p in build.sources() if p.suffix == ".c"]
    result = subprocess.run(
        [build.compiler(), *build.CFLAGS, "-Werror", *build.LDFLAGS,
         f"-I{build.HERE / 'client'}", "-o", str(tmp_path / "strict.so"), *c_files,
         str(CONFORMANCE_C), *build.LIBS],
        capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr


def test_an_out_of_date_library_is_rebuilt_into_the_cache(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    import kiwi_jupyter.shim as shim_module

    monkeypatch.setattr(shim_module, "is_current",
                        lambda library: library.is_relative_to(tmp_path) and library.is_file())
    library = shim_module.library_path()
    assert library.is_relative_to(tmp_path / "kiwi-jupyter" / "shim")
    assert library.is_file()


def test_a_process_without_the_preload_has_no_shim() -> None:
    from kiwi_jupyter.shim import Shim

    assert Shim.attach() is None
    assert Shim.loaded() is False
