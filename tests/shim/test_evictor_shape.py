"""The shim's evictors stand behind one table of operations (struct kiwi_evictor, shim.h): the
pager (mechanisms/pager.c) chooses one instance, and what differs by evictor is one of its
operations. The rules: no C file outside the pager and the evictors' own files names an
evictor, or what KIWI_EVICT asked for; and no file of the shim is over 500 lines. Each check
also runs on a copy of the sources with a fault put in, so that a checker which sees nothing
cannot pass for one that found nothing."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from shim_tiers import code_of, copy_sources

from kiwi_jupyter.shim import build

SHIM = build.HERE

#: Where naming an evictor is the point: the pager that chooses one, the evictors' own files,
#: config.c that reads KIWI_EVICT, shim.h that declares what it read, and the protocol's
#: generated words (client/protocol.h).
ALLOWED = re.compile(
    r"^(mechanisms/(pager\.[ch]|managed\.c|checkpoint\.c|vmm[a-z_]*\.[ch]|config\.c)"
    r"|shim\.h|client/protocol\.h)$")

#: An evictor's instance, the request KIWI_EVICT made, or an evictor's name as a literal.
EVICTOR_NAME = re.compile(
    r"\bkiwi_(managed|vmm|checkpoint)_evictor\b|\bKIWI_EVICTOR_\w+|"
    r"\bKIWI_EVICT_(AUTO|MANAGED|CHECKPOINT|VMM)\b|\bkiwi_cfg\.evict\b|"
    r"\bkiwi_pager_checkpointing\b|"
    r"\"(managed|vmm|checkpoint)\"")


def evictor_names_outside_the_pager(shim: Path) -> list[str]:
    """path:line and the name, wherever a C file outside the pager names an evictor."""
    found = []
    for path in sorted(shim.rglob("*")):
        relative = path.relative_to(shim).as_posix()
        if path.suffix not in (".c", ".h") or ALLOWED.match(relative):
            continue
        for number, line in enumerate(code_of(path).splitlines(), 1):
            found += [f"{relative}:{number}: {m.group(0)}" for m in EVICTOR_NAME.finditer(line)]
    return found


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    """The shim's sources, to put a fault into."""
    return copy_sources(SHIM, tmp_path / "shim")


def test_no_file_outside_the_pager_asks_which_evictor_runs() -> None:
    found = evictor_names_outside_the_pager(SHIM)
    assert not found, "evictor branches outside the pager:\n" + "\n".join(found)


@pytest.mark.parametrize("fault", [
    "static bool vmm_chosen(void) { return kiwi_pager_evictor() == &kiwi_vmm_evictor; }",
    "static bool asked_vmm(void) { return kiwi_cfg.evict == KIWI_EVICT_VMM; }",
    "static int by_name(const char *n) { return strcmp(n, \"checkpoint\"); }",
])
def test_the_rule_finds_an_evictor_branch_put_into_a_client_file(copy: Path, fault: str) -> None:
    release = copy / "client" / "release.c"
    release.write_text(release.read_text() + "\n" + fault + "\n")
    found = evictor_names_outside_the_pager(copy)
    assert found and all(f.startswith("client/release.c:") for f in found)


def test_a_name_in_a_comment_is_no_branch(copy: Path) -> None:
    release = copy / "client" / "release.c"
    release.write_text(release.read_text() + "\n/* under \"vmm\": kiwi_vmm_evictor */\n")
    assert not evictor_names_outside_the_pager(copy)


def test_each_evictor_is_one_instance_of_the_operations_table() -> None:
    instances = {}
    for path in (SHIM / "mechanisms").glob("*.c"):
        for m in re.finditer(r"^const struct kiwi_evictor (kiwi_\w+_evictor) = \{",
                             code_of(path), re.M):
            instances[m.group(1)] = path.name
    assert instances == {"kiwi_managed_evictor": "managed.c",
                         "kiwi_vmm_evictor": "vmm_evictor.c",
                         "kiwi_checkpoint_evictor": "checkpoint.c"}


def files_over_500_lines(shim: Path) -> dict[str, int]:
    return {path.relative_to(shim).as_posix(): lines for path in sorted(shim.rglob("*"))
            if path.suffix in (".c", ".h")
            and (lines := len(path.read_text().splitlines())) > 500}


def test_no_file_of_the_shim_is_over_500_lines() -> None:
    """Small files split by role: the vmm evictor's regions, slabs, cache, frees and contexts
    each in a file of its own, not one file of all that its allocations hold."""
    assert not files_over_500_lines(SHIM)


def test_the_size_rule_finds_a_file_grown_past_500_lines(copy: Path) -> None:
    slabs = copy / "mechanisms" / "vmm_slabs.c"
    slabs.write_text(slabs.read_text() + "\n" * 500)
    assert list(files_over_500_lines(copy)) == ["mechanisms/vmm_slabs.c"]
