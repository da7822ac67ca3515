"""The Python clients of the node daemon (docs/interfaces.md section 4); ``kiwi_jupyter.Client`` is
``Client``.

- ``api.Client``: a process that holds a GPU (a kernel, a script); made of parts, not base
  classes: it holds a ``connection.ClientConnection``, whose thread keeps the daemon reachable
  through restarts and carries requests (lending its socket to a caller waiting for a grant,
  ``lending.SocketLender``), and a ``common.Commands`` for the status and admin calls.
- ``control.ControlClient``: one blocking connection for callers that ask and go (``kiwictl``, the
  Jupyter server's link): status and admin requests, no thread, no hold.
- ``discovery``: where the scheduler's socket is when nobody says; ``backoff``: how long to
  wait before connecting again.

Both clients are I/O shells over ``nodeside.protocol.client_session.ClientSession``, which says
what the protocol says (hello, register, the hold, which reply answers what).

Importing this package imports the protocol and its bounds, never the scheduler or the config.
"""

from nodeside.client.api import DISPLAY_NAME_ENV, Client
from nodeside.client.common import KiwiError, default_name
from nodeside.client.control import ControlClient
from nodeside.client.discovery import find_socket, published_socket_path

__all__ = [
    "DISPLAY_NAME_ENV",
    "Client",
    "ControlClient",
    "KiwiError",
    "default_name",
    "find_socket",
    "published_socket_path",
]
