"""What the scheduler tells the daemon to do, and the error it raises for a request it refuses."""

from __future__ import annotations

from dataclasses import dataclass


class SchedulerError(Exception):
    """A request the scheduler cannot honour; ``code`` is a protocol error code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Grant:
    client: str
    gpu: int
    quantum: float | None  # None in mode off: no quantum runs


@dataclass(frozen=True)
class Drop:
    client: str
    gpu: int
    reason: str
    evict: bool  # the next holder needs the room: move the working set out first
    grace: float


@dataclass(frozen=True)
class Revoke:
    client: str
    gpu: int
    reason: str
    ignored_for: float


@dataclass(frozen=True)
class Released:
    client: str
    evict: bool


Action = Grant | Drop | Revoke | Released
