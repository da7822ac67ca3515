"""``%kiwi status``: the status document (docs/interfaces.md section 5) as a table.

``StatusTable`` is what the magic returns. IPython shows it with ``_repr_html_`` in a notebook and
with ``_repr_pretty_`` in a terminal, so one object serves both.
"""

from __future__ import annotations

import html
from typing import Any

from nodeside.formats import seconds
from nodeside.headline import scheduler_headline
from nodeside.memory_words import (
    gpu_memory_words,
    human_bytes,
    keeps_memory,
    memory_place_word,
    memory_use_words,
    tier_failed_words,
    waiting_for_words,
)
from nodeside.names import current_user, names_by_id, state_word, who

__all__ = ["NAME_WIDTH", "Document", "StatusTable", "evict_cell", "human_bytes"]

Document = dict[str, Any]

#: How wide a client's name may be in the table (``nodeside.names.shorten`` cuts it).
NAME_WIDTH = 40

_CLIENT_COLUMNS = ("client", "pool", "priority", "state", "queue", "GPU time", "working set",
                   "evict")
#: Where each client's memory is, from a daemon that keeps resident memory (issue 31).
_MEMORY_COLUMNS = ("memory", "on GPU", "in host")
#: Where each client's memory is by tier, from a daemon with host and disk tiers (issue 42).
_TIER_COLUMNS = ("on disk",)


def evict_cell(client: dict[str, Any]) -> str:
    """How the client is paged out, and where a checkpointed one stands."""
    evict = client.get("evict") or "managed"
    stage = client.get("checkpoint_state")
    return evict if stage in (None, "running") else f"{evict} ({stage})"


class StatusTable:
    """The scheduler's state, with this kernel's own row marked."""

    def __init__(self, document: Document, me: str | None = None,
                 viewer: str | None = None) -> None:
        self.document = document
        self.me = me  # this kernel's client id, when registered
        self.memory = keeps_memory(document)
        self.tiers = any("tier" in c for c in document.get("clients", []))
        #: Whose view it is: their own kernels need no "(user)" (``nodeside.names.label``).
        self.viewer = viewer if viewer is not None else current_user()

    @property
    def columns(self) -> tuple[str, ...]:
        return _CLIENT_COLUMNS + (_MEMORY_COLUMNS if self.memory else ()) + \
            (_TIER_COLUMNS if self.memory and self.tiers else ())

    def _client_rows(self) -> list[tuple[bool, list[str]]]:
        rows = []
        for c in self.document.get("clients", []):
            position = c.get("queue_position")
            rows.append(
                (
                    c["id"] == self.me,
                    [
                        who(c, NAME_WIDTH, self.viewer),
                        c.get("pool", ""),
                        c.get("priority", ""),
                        state_word(c),
                        "" if position is None else f"#{position}",
                        seconds(c.get("gpu_seconds", 0.0)),
                        human_bytes(c.get("working_set")),
                        evict_cell(c),
                        *(self._memory_cells(c) if self.memory else ()),
                        *(self._tier_cells(c) if self.memory and self.tiers else ()),
                    ],
                )
            )
        return rows

    @staticmethod
    def _memory_cells(client: dict[str, Any]) -> list[str]:
        if "residency" not in client:
            return ["", "", ""]
        return [memory_place_word(client), human_bytes(client.get("resident_bytes")),
                human_bytes(client.get("host_bytes"))]

    @staticmethod
    def _tier_cells(client: dict[str, Any]) -> list[str]:
        return [human_bytes(client["disk_bytes"]) if "disk_bytes" in client else ""]

    def _gpu_lines(self) -> list[str]:
        names = names_by_id(self.document, NAME_WIDTH, self.viewer)
        lines = []
        for gpu in self.document.get("gpus", []):
            held = ", ".join(names.get(h, h) for h in gpu.get("holders", []))
            holders = f"held by {held}" if held else "free"
            left = gpu.get("quantum_remaining")
            quantum = "" if left is None else f", {seconds(left)} left in its quantum"
            lines.append(
                f"GPU {gpu['index']} ({gpu.get('name') or 'unknown'}): "
                f"{holders}{quantum}; {len(gpu.get('queue', []))} waiting"
            )
            if gpu.get("evict_blocked"):
                lines.append(f"GPU {gpu['index']} grants nobody: {gpu['evict_blocked']}")
            # Where each kernel's memory is, where the daemon says; else its use, as the panel.
            memory = gpu_memory_words(gpu) or memory_use_words(gpu.get("memory_used"),
                                                              gpu.get("memory_total"))
            lines.append(f"GPU {gpu['index']} memory: {memory}")
        for client in self.document.get("clients", []):
            waiting = waiting_for_words(client, self.document, NAME_WIDTH, self.viewer)
            if waiting is not None:
                lines.append(f"{names.get(client['id'], client['id'])} is {waiting}")
            failed = tier_failed_words(client)
            if failed is not None:
                lines.append(f"{names.get(client['id'], client['id'])}: {failed}")
        return lines

    def _pool_lines(self) -> list[str]:
        lines = []
        for pool in self.document.get("pools", []):
            maximum = pool.get("maximum", -1)
            cap = "no maximum" if maximum is None or maximum < 0 else f"maximum {maximum:.0%}"
            clients = pool.get("clients", 0)
            lines.append(
                f"pool {pool['name']}: share {pool.get('share', 0.0):.0%}, "
                f"guarantee {pool.get('guarantee', 0.0):.0%}, {cap}, "
                f"{clients} client{'' if clients == 1 else 's'}"
            )
        return lines

    def _heading(self) -> str:
        return scheduler_headline(self.document)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(self.text())

    def __repr__(self) -> str:
        return self.text()

    def text(self) -> str:
        rows = self._client_rows()
        columns = self.columns
        table = [list(columns)] + [cells for _, cells in rows]
        widths = [max(len(row[i]) for row in table) for i in range(len(columns))]
        lines = [self._heading(), *self._gpu_lines(), *self._pool_lines(), ""]
        for index, row in enumerate(table):
            mine = index > 0 and rows[index - 1][0]
            cells = "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))
            lines.append(cells.rstrip() + ("  <- this kernel" if mine else ""))
        if not rows:
            lines.append("(no clients)")
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        esc = html.escape
        head = "".join(f"<th>{esc(c)}</th>" for c in self.columns)
        body = []
        for mine, cells in self._client_rows():
            tds = "".join(f"<td>{esc(cell)}</td>" for cell in cells)
            mark = ' class="jp-Kiwi-thisKernel" style="font-weight:bold"' if mine else ""
            title = ' title="this kernel"' if mine else ""
            body.append(f"<tr{mark}{title}>{tds}</tr>")
        if not body:
            body.append(f'<tr><td colspan="{len(self.columns)}">no clients</td></tr>')
        facts = "".join(f"<li>{esc(line)}</li>" for line in self._gpu_lines() + self._pool_lines())
        return (
            f'<div class="jp-Kiwi-status"><strong>{esc(self._heading())}</strong>'
            f"<ul>{facts}</ul>"
            f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table></div>"
        )
