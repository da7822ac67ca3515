"""The line that heads every text view of the status document (``kiwictl status``, ``%kiwi``).

One helper, so the views cannot drift apart again: the mode reads as the document and the
``kiwictl -S`` lines write it (``on``, ``off``, ``auto``), and the TQ as every view writes a
duration (``nodeside.formats.seconds``).
"""

from __future__ import annotations

from typing import Any

from nodeside.formats import seconds


def scheduler_headline(document: dict[str, Any]) -> str:
    """``Kiwi scheduler: mode on, TQ 30 s, policy round-robin``; an older daemon's document has
    no policy, and that part is left out."""
    mode = str(document.get("mode", "unknown")).lower()
    tq = document.get("tq")
    quantum = f"TQ {seconds(tq)}" if isinstance(tq, (int, float)) else "TQ unknown"
    policy = f", policy {document['policy']}" if document.get("policy") else ""
    return f"Kiwi scheduler: mode {mode}, {quantum}{policy}"
