"""How long to wait before trying again, for every Python peer of the daemon that reconnects.

The client's connection thread, the Jupyter server's status watch and its watch on an embedded
scheduler all try again after a failure, each time waiting twice as long as the time before, up
to a most, and start over after a success. Sans-I/O: it only says how long; the caller waits.
"""

from __future__ import annotations


class Backoff:
    """Delays of ``start``, twice that, and so on up to ``most``; ``reset`` starts over."""

    def __init__(self, start: float, most: float) -> None:
        self.start = start
        self.most = most
        self._delay = start

    def next(self) -> float:
        """The delay before the next try; the one after is twice as long (up to ``most``)."""
        delay = self._delay
        self._delay = min(delay * 2, self.most)
        return delay

    def reset(self) -> None:
        """A try succeeded: the next failure waits ``start`` again."""
        self._delay = self.start
