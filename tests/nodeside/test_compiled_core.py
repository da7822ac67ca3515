"""The compiled scheduler core (mypyc, nodeside/compiled.py) and its pure Python fallback.

The suite runs on whichever core the install built: ``make install`` compiles it, so the
compiled modules are what these tests and every other test exercise. The pure core is exercised
by running the scheduler's and the policy's tests again in a child pytest with
``KIWI_PURE_PYTHON=1``; the child runs this file too, so it checks that it really ran pure.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support import scaled

import nodeside
import nodeside.scheduler.core
from nodeside import compiled

REPO = Path(__file__).resolve().parents[2]
PURE = compiled.pure_asked(os.environ)
#: The scheduler's own tests and the policy's, which the pure core must pass as well.
PURE_RUN = ["tests/nodeside/test_compiled_core.py", "tests/nodeside/test_core_evict_first.py",
            "tests/nodeside/test_core_invariants.py", "tests/nodeside/test_core_round_robin.py",
            "tests/nodeside/test_hold_state.py", "tests/nodeside/test_queue_position.py",
            "tests/nodeside/test_session.py", "tests/nodeside/test_protocol_fast.py",
            "tests/nodeside/test_status_document.py", "tests/policy"]


def module_files() -> list[str]:
    return [sys.modules[name].__file__ or "" for name in compiled.MODULES
            if name in sys.modules]


@pytest.mark.skipif(PURE, reason="KIWI_PURE_PYTHON is set: this run checks the pure core")
def test_the_installed_core_is_compiled_and_every_module_of_it_runs_compiled() -> None:
    assert nodeside.core() == "compiled (mypyc)", \
        "make install (pip install -e .) compiles the core; after an edit run it again"
    assert nodeside.scheduler.core.__file__.endswith(".so")
    assert all(not path.endswith(".py") for path in module_files())


@pytest.mark.skipif(not PURE, reason="runs in the pure child run")
def test_with_kiwi_pure_python_every_core_module_runs_from_its_source() -> None:
    assert nodeside.core() == "pure Python (KIWI_PURE_PYTHON is set)"
    assert module_files() and all(path.endswith(".py") for path in module_files())


@pytest.mark.slow
@pytest.mark.timeout(int(scaled(300)))
@pytest.mark.skipif(PURE, reason="this is the pure run")
def test_the_pure_core_passes_the_scheduler_and_policy_tests() -> None:
    env = {**os.environ, compiled.PURE_ENV: "1"}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                           *PURE_RUN], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=scaled(280))
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and "skipped" in done.stdout  # the compiled-only test


def test_kiwi_scheduler_version_names_the_core_it_runs() -> None:
    for env, said in (({}, nodeside.core()), ({compiled.PURE_ENV: "1"},
                                                "pure Python (KIWI_PURE_PYTHON is set)")):
        done = subprocess.run([sys.executable, "-m", "nodeside.daemon", "--version"],
                              env={**os.environ, **env}, capture_output=True, text=True,
                              timeout=scaled(60), check=True)
        assert done.stdout.strip() == f"kiwi-scheduler {nodeside.__version__}, scheduler core " \
                                      f"{said}"


# -- when the compiled modules may not run -----------------------------------------------------

@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of the core's sources, stamped as if built from them, every extension there."""
    for module in compiled.MODULES:
        target = compiled.source(tmp_path, module)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(compiled.source(REPO, module), target)
    for module in (*compiled.MODULES, compiled.GROUP + "__mypyc"):
        compiled.extension(tmp_path, module).write_bytes(b"")
    (tmp_path / "nodeside" / compiled.STAMP).write_text(compiled.stamp_text(tmp_path))
    return tmp_path


def later_edit(source: Path, old: str, new: str) -> None:
    """Edit a source as a person would, after the build: the file's time moves on. Set
    explicitly, a second on, since the fixture's copy and this edit may fall in one tick of the
    file system's clock."""
    before = source.stat()
    source.write_text(source.read_text().replace(old, new, 1))
    os.utime(source, ns=(before.st_atime_ns, before.st_mtime_ns + 10**9))


def touch(source: Path) -> None:
    later_edit(source, "", "")  # saved again unchanged, as a checkout or an editor may


def test_a_build_from_other_sources_never_runs_in_their_place(tree: Path) -> None:
    source = compiled.source(tree, "nodeside.scheduler.turns")
    source.write_text(source.read_text() + "\n# edited after the build\n")
    core = compiled.choose(tree, {})
    assert not core.compiled and "built from other sources" in core.reason


def test_an_edit_that_keeps_the_sources_size_is_caught_by_its_time(tree: Path) -> None:
    source = compiled.source(tree, "nodeside.scheduler.turns")
    size = source.stat().st_size
    later_edit(source, "def ", "def_")  # a same-size edit of no sense: the hash must tell
    assert source.stat().st_size == size
    core = compiled.choose(tree, {})
    assert not core.compiled and "built from other sources" in core.reason


def test_checking_an_untouched_build_hashes_nothing(tree: Path) -> None:
    # Every kernel and kiwictl makes this check at import: it must not read the 28 sources
    # again, nor load hashlib (OpenSSL), while their sizes and times are as the build saw them.
    check = ("import sys; from pathlib import Path; from nodeside import compiled; "
             "core = compiled.choose(Path(sys.argv[1]), {}); "
             "print(core.compiled, 'built from other sources' in core.reason, "
             "'hashlib' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", check, str(tree)], capture_output=True,
                          text=True, timeout=scaled(60), check=True)
    assert done.stdout.split() == [str(compiled.choose(tree, {}).compiled), "False", "False"]


def test_a_touched_but_unchanged_source_keeps_the_build_and_the_hash_decides(tree: Path) -> None:
    built = compiled.choose(tree, {})
    touch(compiled.source(tree, "nodeside.scheduler.turns"))
    assert compiled.choose(tree, {}) == built
    assert "built from other sources" not in built.reason


def test_a_stamp_without_sizes_and_times_is_checked_by_its_hash(tree: Path) -> None:
    stamp = tree / "nodeside" / compiled.STAMP
    stamp.write_text(compiled.sources_digest(tree) + "\n")  # as builds wrote it before
    assert "built from other sources" not in compiled.choose(tree, {}).reason
    later_edit(compiled.source(tree, "nodeside.limits"), "\n", "\n\n")
    assert "built from other sources" in compiled.choose(tree, {}).reason


def test_make_core_restamps_an_unchanged_build_but_never_a_stale_one(tree: Path) -> None:
    stamp = tree / "nodeside" / compiled.STAMP
    touch(compiled.source(tree, "nodeside.scheduler.turns"))
    assert compiled.restamp(tree)
    assert stamp.read_text() == compiled.stamp_text(tree)
    later_edit(compiled.source(tree, "nodeside.limits"), "\n", "\n\n")
    before = stamp.read_text()
    assert not compiled.restamp(tree)
    assert stamp.read_text() == before
    assert "built from other sources" in compiled.choose(tree, {}).reason


def test_a_missing_extension_makes_the_whole_core_pure(tree: Path) -> None:
    compiled.extension(tree, "nodeside.daemon.session").unlink()
    core = compiled.choose(tree, {})
    assert not core.compiled and "nodeside.daemon.session is missing" in core.reason


def test_a_missing_shared_library_makes_the_whole_core_pure(tree: Path) -> None:
    compiled.extension(tree, compiled.GROUP + "__mypyc").unlink()
    core = compiled.choose(tree, {})
    assert not core.compiled and f"{compiled.GROUP}__mypyc is missing" in core.reason


def test_no_stamp_means_not_compiled(tree: Path) -> None:
    (tree / "nodeside" / compiled.STAMP).unlink()
    assert compiled.choose(tree, {}) == compiled.Core(False, "not compiled")


def test_kiwi_pure_python_wins_over_a_good_build(tree: Path) -> None:
    assert str(compiled.choose(tree, {compiled.PURE_ENV: "1"})) == \
        "pure Python (KIWI_PURE_PYTHON is set)"
    assert compiled.pure_asked({compiled.PURE_ENV: "0"}) is False

