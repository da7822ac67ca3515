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


# ---- one table of allocations, one lock for its figures ------------------------------------

#: A table of allocation records: a static array of pointers to them (a hash table's buckets).
ALLOCATION_TABLE = re.compile(r"^static struct (vmm_)?allocation \*(\w+)\[", re.M)
#: A write of a working-set figure (memory.h): the bytes by kind, the count of allocations.
FIGURE_WRITE = re.compile(
    r"\b(kiwi_(managed|vmm|mapped|pinned)_bytes|allocation_count)\s*(\+\+|--|[-+]?=(?!=))"
    r"|\*kiwi_bytes_of\([^)]*\)\s*[-+]?=")
LOCK = re.compile(r"^(?:static )?pthread_mutex_t (\w+)", re.M)


def allocation_tables(shim: Path) -> dict[str, str]:
    """file: the table, for every table of allocation records in the shim."""
    return {f"{path.relative_to(shim).as_posix()}:{m.group(2)}": m.group(0)
            for path in sorted(shim.rglob("*.c")) for m in ALLOCATION_TABLE.finditer(code_of(path))}


def figure_locks(shim: Path) -> dict[str, list[str]]:
    """file: the mutexes it defines, for every file that writes a working-set figure."""
    return {path.relative_to(shim).as_posix(): LOCK.findall(code)
            for path in sorted(shim.rglob("*.c"))
            if FIGURE_WRITE.search(code := code_of(path))}


def test_the_shim_keeps_one_table_of_allocations() -> None:
    """memory.c's table holds every allocation, the vmm evictor's placements hanging off its
    records; vmm_reuse.c's index holds only frees pending on a stream (memory no longer the
    program's, filed for its stream's next allocation)."""
    assert sorted(allocation_tables(SHIM)) == ["mechanisms/memory.c:table",
                                               "mechanisms/vmm_reuse.c:filed"]


def test_the_figures_are_counted_under_one_lock() -> None:
    """The working set's figures are written in memory.c and limit.c only, under the one lock
    memory.c defines (limit.c defines none)."""
    assert figure_locks(SHIM) == {"mechanisms/limit.c": [],
                                  "mechanisms/memory.c": ["kiwi_table_lock"]}


def test_the_order_of_the_locks_is_written_where_the_table_lock_is_declared() -> None:
    header = (SHIM / "mechanisms" / "memory.h").read_text()
    order = re.search(r"in the order they are taken.*?\*/", header, re.S)
    assert order, "memory.h says no order of the locks"
    names = ["paging lock", "kiwi_vmm_lock", "kiwi_table_lock"]
    at = [order.group(0).find(name) for name in names]
    assert -1 not in at and at == sorted(at), order.group(0)


def test_the_rules_find_a_second_table_and_a_second_lock(copy: Path) -> None:
    allocations = copy / "mechanisms" / "vmm_allocations.c"
    allocations.write_text(allocations.read_text() + (
        "\nstatic struct vmm_allocation *by_address[4096];\n"
        "static pthread_mutex_t figures_lock = PTHREAD_MUTEX_INITIALIZER;\n"
        "static void count(size_t n) { kiwi_mapped_bytes += n; }\n"))
    assert "mechanisms/vmm_allocations.c:by_address" in allocation_tables(copy)
    assert figure_locks(copy)["mechanisms/vmm_allocations.c"] == ["figures_lock"]
