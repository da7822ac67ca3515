"""The wire protocol between the node daemon and its clients, written once.

Every message is one JSON object on one line of UTF-8, ended by ``\\n``, over a Unix stream
socket. The package is sans-I/O throughout: nothing in it touches a socket, a clock or a thread.

- ``messages``: the one table of messages (op, fields and their types, who sends each and what
  it answers), error codes, features and reasons. ``document``: the status document's shape.
  ``hold``: a client's six hold states and the moves between them.
- ``names`` (generated from the table): every op, code and reason as a constant, re-exported
  here, so that ``from nodeside import protocol as p; p.GRANT`` is how code names them.
- ``wire``: bytes to messages and back, and whether a request is well formed (compiled, mypyc).
- ``client_session``: ``ClientSession``, a client's side of a connection (bytes in, events and
  bytes out) under every Python client.
- ``generate``: ``python -m nodeside.protocol.generate [--check]`` writes what the table makes
  for others: docs/protocol.md's tables, the shim's C header, the panel's TypeScript types.
"""

from nodeside.protocol import names
from nodeside.protocol.names import *  # noqa: F403 - every name, listed in names.__all__
from nodeside.protocol.wire import (
    LineBuffer,
    ProtocolError,
    check_request,
    decode,
    drop_line,
    encode,
    error,
    grant_line,
    plain_request,
    released_line,
    waiting_line,
)

__all__ = ["LineBuffer", "ProtocolError", "check_request", "decode", "drop_line", "encode",
           "error", "grant_line", "plain_request", "released_line", "waiting_line"]
__all__ += names.__all__
