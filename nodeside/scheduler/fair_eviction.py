"""Fair eviction: how often a waiter may have an idle client's memory moved out for it.

An eviction costs its victim a restore before its next cell: seconds of a person's time for a
working set of a few GiB. Three rules keep one client from charging that to others at will
(the ``memory`` feature, residency.py asks them before every ``Evict`` or ``Suspend`` for room):

* **Per victim**: one client is asked to evict at most once every ``evict_interval`` seconds
  (config, default 2), whoever asks; a waiter waits for the rest of the interval, while grants
  that need no room go on.
* **Priority**: a preemptible (LOW) waiter never cuts a quantum short, and likewise its memory
  need may push a non-preemptible kernel's memory out at most once a TQ: no more often than
  the pool rules would hand the GPU from that kernel to it.
* **Use**: only grants a client uses make others evict. A hold that others evicted for is used
  when the client was seen (its reports, or NVML) holding at least half of what it needed when
  it was granted; a wait that others evicted for and that the client cancelled, or a grant it
  did not use, doubles the time before its next wait may ask anyone to evict (from
  ``evict_interval``, at most ``MAX_BACKOFF``); a used grant clears it.

Plain functions over the clients' own fields, sans I/O, with the time passed in; the metrics
count evictions by the priority and the client that asked (``GpuState.evictions_by``,
``ClientRecord.evictions_asked``).
"""

from __future__ import annotations

from typing import Final

from nodeside.scheduler.clients import ClientRecord

#: Seconds a client that keeps wasting evictions waits at most before its next may ask.
MAX_BACKOFF: Final = 600.0
#: The backoff's first step where ``evict_interval`` is shorter (or 0, no interval).
MIN_BACKOFF: Final = 1.0


def may_ask_at(victim: ClientRecord, waiter: ClientRecord, interval: float, tq: float) -> float:
    """When ``victim`` may next be asked to evict for ``waiter`` (0: it never was)."""
    last = victim.eviction.last_asked
    if last is None:
        return 0.0
    if waiter.preemptible and not victim.preemptible:
        interval = max(interval, tq)
    return last + interval


def asked(victim: ClientRecord, waiter: ClientRecord, now: float) -> None:
    """``victim`` was asked to evict for ``waiter`` now."""
    victim.eviction.last_asked = now
    waiter.room_asked += 1
    waiter.evictions_asked += 1


def granted(client: ClientRecord, need: int, seen: int) -> None:
    """``client`` was granted, needing ``need`` bytes and holding ``seen`` now: its hold is
    watched for use (judged where others evicted for it)."""
    client.room_need = need
    client.room_made = client.room_asked > 0
    client.room_asked = 0
    client.peak_bytes = seen


def seen(client: ClientRecord, nbytes: int) -> None:
    """A holder was seen with ``nbytes`` on the GPU (a report, NVML)."""
    if nbytes > client.peak_bytes:
        client.peak_bytes = nbytes


def hold_ended(client: ClientRecord, now: float, interval: float) -> None:
    """``client``'s hold ended: a hold it used clears its backoff; one that others evicted for
    and that it did not use lengthens it."""
    need, made = client.room_need, client.room_made
    client.room_need, client.room_made = 0, False
    if need and 2 * client.peak_bytes >= need:
        client.unused_room = 0
        client.may_ask_from = 0.0
    elif made:
        _wasted(client, now, interval)


def wait_ended(client: ClientRecord, now: float, interval: float, cancelled: bool) -> None:
    """``client`` stopped waiting without a grant: cancelled (others' evictions wasted), or
    refused (the daemon's doing, not the client's)."""
    if client.room_asked and cancelled:
        _wasted(client, now, interval)
    client.room_asked = 0


def _wasted(client: ClientRecord, now: float, interval: float) -> None:
    client.unused_room += 1
    base = max(interval, MIN_BACKOFF)
    client.may_ask_from = now + min(MAX_BACKOFF, base * 2.0 ** (client.unused_room - 1))
