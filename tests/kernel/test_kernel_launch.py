"""The Kiwi kernelspec and launcher: installed, launched, and the shim preloaded by re-exec."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from ipykernel.kernelspec import get_kernel_dict
from jupyter_client.kernelspec import KernelSpecManager
from kernel_support import KernelUnderTest, entry, scheduler_status, start_kernels
from support import DaemonProcess, scaled

from kiwi_jupyter.kernel.launcher import (
    preload_plan,
    without_expandable_segments,
)

ARGV_TAIL = ["-m", "kiwi_jupyter.kernel", "-f", "{connection_file}"]


def install(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kiwi_jupyter.kernelspec", "install", *args],
                          capture_output=True, text=True, timeout=60)


@pytest.fixture(scope="module")
def prefix(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A prefix with the kernelspec installed twice: as `kiwi` and as the default `python3`."""
    prefix = tmp_path_factory.mktemp("prefix")
    assert install("--prefix", str(prefix)).returncode == 0
    assert install("--prefix", str(prefix), "--as-default").returncode == 0
    return prefix


@pytest.fixture(scope="module")
def preloadable(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real shared library standing where a shim would, with one symbol to find it by."""
    folder = tmp_path_factory.mktemp("lib")
    (folder / "marker.c").write_text("int kiwi_test_marker(void) { return 42; }\n")
    library = folder / "libmarker.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(library), str(folder / "marker.c")],
                   check=True, timeout=60)
    return library


@pytest.fixture(scope="module")
def kernel(module_daemon: DaemonProcess, prefix: Path,
           preloadable: Path) -> Iterator[KernelUnderTest]:
    """A kernel from the installed default (`python3`) spec, told to preload a library; the
    spec is the one `install` wrote, with ipykernel's protocol fields in it."""
    (kernel,) = start_kernels(module_daemon.directory, module_daemon.socket,
                              kernel_name="python3",
                              kernel_dirs=[str(prefix / "share/jupyter/kernels")],
                              KIWI_SHIM="1", KIWI_SHIM_LIBRARY=str(preloadable),
                              KIWI_POOL="inference", KIWI_PRIORITY="HIGH",
                              PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True,backend:native")
    yield kernel
    kernel.shutdown()


def test_install_writes_the_kiwi_kernelspec_for_this_interpreter(prefix: Path) -> None:
    folder = prefix / "share/jupyter/kernels/kiwi"
    spec = json.loads((folder / "kernel.json").read_text())
    assert spec["argv"] == [sys.executable, *ARGV_TAIL]
    assert spec["display_name"] == "Python 3 (Kiwi vGPU)"
    assert spec["language"] == "python"
    assert (folder / "logo-64x64.png").is_file()


@pytest.mark.parametrize("name", ["kiwi", "python3"])
def test_the_installed_spec_declares_what_ipykernels_own_spec_declares(prefix: Path,
                                                                      name: str) -> None:
    """kernel_protocol_version, metadata.supported_encryption, ...: what this ipykernel says."""
    spec = json.loads((prefix / f"share/jupyter/kernels/{name}/kernel.json").read_text())
    ipykernels = get_kernel_dict()
    for field in set(ipykernels) - {"argv", "display_name", "metadata"}:
        assert spec.get(field) == ipykernels[field], field
    assert spec["metadata"] == {**ipykernels["metadata"], "kiwi": {"extension": "kiwi_jupyter"}}
    assert spec["interrupt_mode"] == "signal"


def test_as_default_installs_it_as_the_python3_kernel(prefix: Path) -> None:
    spec = json.loads((prefix / "share/jupyter/kernels/python3/kernel.json").read_text())
    assert spec["argv"] == [sys.executable, *ARGV_TAIL]
    assert spec["display_name"] == "Python 3 (Kiwi vGPU)"


def test_install_locations_are_exclusive() -> None:
    refused = install("--user", "--sys-prefix")
    assert refused.returncode == 2
    assert "not allowed with argument" in refused.stderr


def test_the_package_installs_the_kiwi_kernelspec_into_its_prefix() -> None:
    spec = KernelSpecManager().get_kernel_spec("kiwi")
    assert spec.display_name == "Python 3 (Kiwi vGPU)"
    assert spec.argv[1:] == ARGV_TAIL
    assert Path(spec.resource_dir).is_relative_to(Path(sys.prefix) / "share/jupyter/kernels")


def test_the_installed_kernelspec_launches_a_kernel_with_the_extension_loaded(
        kernel: KernelUnderTest, module_daemon: DaemonProcess) -> None:
    assert kernel.run("'kiwi_jupyter' in get_ipython().extension_manager.loaded").value is True
    row = entry(scheduler_status(module_daemon.socket), kernel.kernel_id)
    assert row is not None, "the kernel did not register under its Jupyter kernel id"


def test_the_kernel_from_the_derived_spec_answers_kernel_info(kernel: KernelUnderTest) -> None:
    """The spec ipykernel's fields were merged into still starts a kernel that speaks the
    protocol. (ipykernel 7.4's spec says 5.5 where its kernel_info says 5.3, so the two
    versions are not compared: ours repeats ipykernel's spec, as a spec should.)"""
    reply = kernel.client.kernel_info(reply=True, timeout=scaled(30))["content"]
    assert reply["status"] == "ok"
    assert (reply["implementation"], reply["language_info"]["name"]) == ("ipython", "python")
    assert reply["protocol_version"].startswith("5.")


def test_the_kernel_takes_its_pool_and_priority_from_the_environment(
        kernel: KernelUnderTest, module_daemon: DaemonProcess) -> None:
    row = entry(scheduler_status(module_daemon.socket), kernel.kernel_id)
    assert (row["pool"], row["priority"]) == ("inference", "HIGH")


def test_the_launcher_preloads_the_shim_by_reexecuting_in_place(
        kernel: KernelUnderTest, preloadable: Path) -> None:
    seen = kernel.run(
        "import ctypes, os\n"
        "(os.environ['LD_PRELOAD'], ctypes.CDLL(None).kiwi_test_marker(), os.getpid(),"
        " os.environ['KIWI_KERNEL_ID'])").value
    assert seen == (str(preloadable), 42, kernel.pid, kernel.kernel_id)


def test_the_shimmed_kernel_turns_pytorchs_expandable_segments_off(
        kernel: KernelUnderTest) -> None:
    """Expandable segments are cuMemCreate memory, which the shim cannot page out yet."""
    conf = kernel.run("import os; os.environ['PYTORCH_CUDA_ALLOC_CONF']").value
    assert conf == "backend:native,expandable_segments:False"


@pytest.mark.parametrize(("conf", "expected"), [
    ("expandable_segments:True", "expandable_segments:False"),
    ("max_split_size_mb:128, expandable_segments : True", "max_split_size_mb:128,"
                                                           "expandable_segments:False"),
    ("backend:cudaMallocAsync", "backend:cudaMallocAsync"),
    ("", ""),
])
def test_expandable_segments_are_turned_off_and_nothing_else_changes(conf: str,
                                                                     expected: str) -> None:
    assert without_expandable_segments(conf) == expected


def test_kiwi_shim_0_never_preloads(preloadable: Path) -> None:
    assert preload_plan({"KIWI_SHIM": "0", "KIWI_SHIM_LIBRARY": str(preloadable)}) is None


def test_a_preloaded_shim_is_not_preloaded_again(preloadable: Path) -> None:
    environ = {"KIWI_SHIM": "1", "KIWI_SHIM_LIBRARY": str(preloadable),
               "LD_PRELOAD": f"/lib/other.so {preloadable}"}
    assert preload_plan(environ) is None


@pytest.mark.parametrize("preloaded", [
    "/usr/local/lib/kiwi/libkiwi.so",          # the device plugin's, in a pod
    "/opt/kiwi-0.0.9/lib/libkiwishim.so",      # another install's, maybe another version
    "/usr/lib/libkiwishim.so.1",
])
def test_any_preloaded_kiwi_shim_is_not_joined_by_a_second(preloadable: Path,
                                                           preloaded: str) -> None:
    environ = {"KIWI_SHIM": "1", "KIWI_SHIM_LIBRARY": str(preloadable),
               "LD_PRELOAD": f"/lib/other.so:{preloaded}"}
    assert preload_plan(environ) is None


def test_other_preloaded_libraries_do_not_stop_the_shim(preloadable: Path) -> None:
    environ = {"KIWI_SHIM": "1", "KIWI_SHIM_LIBRARY": str(preloadable),
               "LD_PRELOAD": "/usr/lib/libjemalloc.so.2 /opt/kiwix/libkiwix.so"}
    assert preload_plan(environ) == preloadable


def test_kiwi_shim_1_preloads_without_a_cuda_driver(preloadable: Path) -> None:
    assert preload_plan({"KIWI_SHIM": "1", "KIWI_SHIM_LIBRARY": str(preloadable)}) == preloadable


def test_kiwi_shim_1_without_a_library_says_so(capsys: pytest.CaptureFixture[str],
                                               tmp_path: Path) -> None:
    missing = tmp_path / "libnothing.so"
    assert preload_plan({"KIWI_SHIM": "1", "KIWI_SHIM_LIBRARY": str(missing)}) is None
    assert "no shim library was found" in capsys.readouterr().err


#: Run in a fresh interpreter: a driver found by soname in this one may be a fake that another
#: test loaded by path (tests/shim/test_checkpoint_api.py loads one as libcuda.so.1). Exit 3:
#: a real driver is present, so there is nothing to check.
WITHOUT_A_DRIVER = """
import sys
from kiwi_jupyter.kernel.launcher import cuda_driver_present, preload_plan
if cuda_driver_present():
    sys.exit(3)
print(preload_plan({"KIWI_SHIM_LIBRARY": sys.argv[1]}))
"""


def test_without_a_cuda_driver_the_shim_is_not_preloaded(preloadable: Path) -> None:
    result = subprocess.run([sys.executable, "-c", WITHOUT_A_DRIVER, str(preloadable)],
                            capture_output=True, text=True, timeout=60)
    if result.returncode == 3:
        pytest.skip("a CUDA driver is present here")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "None"


def documented_config_snippet() -> str:
    """The ipython_kernel_config.py snippet docs/kernel.md gives for images: its one Python
    block that reads IPython's config (``get_config()``), wherever it stands; it must parse."""
    doc = (Path(__file__).parents[2] / "docs" / "kernel.md").read_text()
    blocks = [textwrap.dedent(b.split("```", 1)[0]) for b in doc.split("```python\n")[1:]]
    [snippet] = [block for block in blocks if "get_config()" in block]
    compile(snippet, "ipython_kernel_config.py", "exec")
    return snippet


def test_the_documented_config_snippet_loads_the_extension_in_a_plain_kernel(
        module_daemon: DaemonProcess, tmp_path: Path) -> None:
    profile = tmp_path / "ipython" / "profile_default"
    profile.mkdir(parents=True)
    (profile / "ipython_kernel_config.py").write_text(documented_config_snippet())
    (plain,) = start_kernels(module_daemon.directory, module_daemon.socket,
                             kernel_name="python3", IPYTHONDIR=str(tmp_path / "ipython"))
    try:
        argv = plain.run("import sys; sys.argv[0]").value
        assert "ipykernel" in argv, "not ipykernel's own kernel"
        assert plain.run("'kiwi_jupyter' in get_ipython().extension_manager.loaded").value
        assert entry(scheduler_status(module_daemon.socket), plain.kernel_id) is not None
    finally:
        plain.shutdown()
