"""Errors that stop a node process from starting, kept in a leaf module: the daemon, its socket
and the metrics server raise them, and the entry point reports them, without any of these
importing another for the error's sake."""

from __future__ import annotations


class DaemonError(Exception):
    """The daemon cannot start; the message says why."""
