"""The status reply, kept within what every client reads (``protocol.MAX_REPLY_BYTES``).

Names, pools and labels are bounded (``nodeside.limits``) and so is the number of clients, but
64 labels of 256 escaped bytes on each of 2048 clients would still pass the bound. Labels are
the one part of the document nobody needs to see who is holding what, so when the whole would
not fit they are left out, and the document says so.
"""

from __future__ import annotations

from typing import Any

from nodeside import protocol as p


def status_line(status: dict[str, Any], seq: int | None,
                limit: int = p.MAX_REPLY_BYTES) -> bytes:
    line = p.encode(p.STATUS_REPLY, seq=seq, status=status)
    if len(line) <= limit:
        return line
    trimmed = {**status, "labels_omitted": True,
               "clients": [{k: v for k, v in c.items() if k != "labels"}
                           for c in status.get("clients", [])]}
    line = p.encode(p.STATUS_REPLY, seq=seq, status=trimmed)
    if len(line) <= limit:
        return line
    # Not reachable within limits.MAX_CLIENTS; a test holds that true. Should a future field
    # break it, a clear error beats a line no client can read.
    return p.error(p.E_LIMIT, f"the status document is over {limit} bytes", seq)
