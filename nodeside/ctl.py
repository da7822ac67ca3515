"""``kiwictl``: turn the scheduler on and off, set its TQ, and see what it is doing.

Exit status: 0 done; 1 the daemon refused or could not be reached (one line on stderr);
2 bad usage. The success lines are the ones the seed's operations guide shows admins.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from nodeside import kai
from nodeside.client import ControlClient, KiwiError
from nodeside.client.discovery import published_socket_path
from nodeside.config import argument_type, parse_mode, parse_tq
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
from nodeside.names import current_user, names_by_id, shorten, state_word, who
from nodeside.protocol import DEFAULT_SOCKET

_MODE_DONE = {
    "on": "Successfully turned on the Kiwi scheduler.",
    "off": "Successfully turned off the Kiwi scheduler.",
    "auto": "Successfully set the Kiwi scheduler to auto mode.",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kiwictl", description="Control the Kiwi scheduler.")
    parser.add_argument("--socket", default=None,
                        help=f"the daemon's socket (default: $KIWI_SOCKET; unset: "
                        f"{DEFAULT_SOCKET}, then the one a Jupyter server published at "
                        f"{published_socket_path()})")
    parser.add_argument("-S", dest="mode", type=argument_type(parse_mode), metavar="on|off|auto",
                        help="turn the scheduler on, off, or to auto mode")
    parser.add_argument("-T", dest="tq", type=argument_type(parse_tq), metavar="SECONDS",
                        help="set the time quantum")
    parser.add_argument("--gpu", type=int, help="with -T: set the TQ of this GPU only")
    commands = parser.add_subparsers(dest="command")
    status = commands.add_parser("status", help="show the scheduler's state")
    status.add_argument("--json", action="store_true", help="print the status document")
    pools = commands.add_parser("pools", help="show each pool's share, guarantee, maximum, "
                                "waiting clients and why a pool is stuck; `pools export` writes "
                                "them for other schedulers")
    pools.add_argument("--json", action="store_true", help="print the status document's pools")
    kai.add_export_parser(pools.add_subparsers(dest="pools_command"))
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.mode is None and args.tq is None and args.command is None:
        parser.print_usage(sys.stderr)
        print("kiwictl: error: say what to do: -S, -T, status or pools", file=sys.stderr)
        return 2
    if args.command == "pools" and args.pools_command == "export":
        return kai.export_command(args)
    try:
        with ControlClient(args.socket, timeout=10.0) as client:
            if args.mode is not None:
                client.set_mode(args.mode)
                _info(_MODE_DONE[args.mode])
            if args.tq is not None:
                client.set_tq(args.tq, args.gpu)
                where = "" if args.gpu is None else f" on GPU {args.gpu}"
                _info(f"Successfully set the Kiwi scheduler's TQ to {args.tq:g} seconds{where}.")
            if args.command == "pools":
                document = client.status()
                if args.json:
                    print(json.dumps(document["pools"], indent=2))
                else:
                    print(format_pools(document))
            if args.command == "status":
                document = client.status()
                if args.json:
                    print(json.dumps(document, indent=2))
                else:
                    print(format_status(document))
    except PermissionError as exc:
        return _fail(str(exc))
    except (ConnectionError, TimeoutError) as exc:
        return _fail(str(exc))
    except (KiwiError, ValueError) as exc:
        return _fail(f"The Kiwi scheduler refused: {exc}")
    return 0


def format_status(doc: dict[str, Any]) -> str:
    """The status document as a short report for a terminal."""
    viewer = current_user()
    names = names_by_id(doc, width=60, viewer=viewer)
    clients = {c["id"]: c for c in doc["clients"]}
    shows_memory = keeps_memory(doc)
    lines = [scheduler_headline(doc)]
    for gpu in doc["gpus"]:
        lines.append(f"GPU {gpu['index']} {gpu['name']}")
        paused = {c["id"] for c in doc["clients"] if c.get("paused")}
        holders = ", ".join(names.get(h, h) + (" (paused)" if h in paused else "")
                            for h in gpu["holders"]) or "nobody"
        left = gpu["quantum_remaining"]
        lines.append(f"  holding: {holders}"
                     + ("" if left is None else f" ({seconds(left)} left in its quantum)"))
        # Where each kernel's memory is, where the daemon says; else its use, as the panel.
        memory = gpu_memory_words(gpu) or memory_use_words(gpu["memory_used"],
                                                           gpu["memory_total"])
        lines.append(f"  memory: {memory}")
        if gpu.get("turns"):
            lines.append(f"  taking turns of {seconds(gpu['turns'])}, least GPU time in the "
                         "cell first")
        for position, client_id in enumerate(gpu["queue"], 1):
            waiting = waiting_for_words(clients.get(client_id, {}), doc, width=60,
                                        viewer=viewer)
            lines.append(f"  #{position} waiting: {names.get(client_id, client_id)}"
                         + ("" if waiting is None else f", {waiting}"))
        if gpu.get("next_reason"):
            lines.append(f"  next, because: {gpu['next_reason']}")
    if doc["clients"]:
        lines.append("")
        head = (f"{'CLIENT':<36} {'ID':<6} {'POOL':<12} {'PRIORITY':<8} {'STATE':<8} "
                f"{'GPU TIME':>10}")
        shows_disk = any("disk_bytes" in c for c in doc["clients"])
        if shows_memory:
            head += f" {'MEMORY':<14} {'ON GPU':>10} {'IN HOST':>10}"
            if shows_disk:
                head += f" {'ON DISK':>10}"
        lines.append(head)
        for c in doc["clients"]:
            row = (f"{who(c, 36, viewer):<36} {c['id']:<6} {shorten(c['pool'], 12):<12} "
                   f"{c['priority']:<8} {state_word(c):<8} "
                   f"{seconds(c['gpu_seconds']):>10}")
            if shows_memory and "residency" in c:
                row += (f" {memory_place_word(c):<14} "
                        f"{human_bytes(c.get('resident_bytes')):>10} "
                        f"{human_bytes(c.get('host_bytes')):>10}")
                if shows_disk:
                    row += f" {human_bytes(c.get('disk_bytes', 0)):>10}"
            lines.append(row)
            failed = tier_failed_words(c)
            if failed is not None:
                lines.append(f"  {failed}")
    return "\n".join(lines)


def format_pools(doc: dict[str, Any]) -> str:
    """The pools report: shares against guarantee and maximum, who waits, and why."""
    reason = doc.get("preemption_off_reason")
    lines = ["Preemption: " + ("on" if doc.get("preemption", True) else "off")
             + (f" ({reason})" if reason else "")]
    lines.append(f"{'POOL':<16} {'SHARE':>6} {'GUARANTEE':>9} {'WEIGHT':>6} {'MAXIMUM':>7} "
                 f"{'CLIENTS':>7} {'HOLDING':>7} {'WAITING':>7}")
    for pool in doc["pools"]:
        maximum = "none" if pool["maximum"] < 0 else f"{pool['maximum']:g}"
        lines.append(f"{pool['name'][:16]:<16} {pool['share']:>6.2f} {pool['guarantee']:>9g} "
                     f"{pool['weight']:>6g} {maximum:>7} {pool['clients']:>7} "
                     f"{pool.get('holding', 0):>7} {pool.get('waiting', 0):>7}")
        if pool.get("waiting_clients"):
            lines.append(f"  waiting: {', '.join(pool['waiting_clients'])}")
        if pool.get("stuck"):
            lines.append(f"  stuck: {pool['stuck']}")
    return "\n".join(lines)


def _info(message: str) -> None:
    print(f"[INFO] {message}")


def _fail(message: str) -> int:
    print(f"[ERROR] {message}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
