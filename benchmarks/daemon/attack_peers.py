"""The attacks of issue 40 on the probe (``benchmarks/daemon/attack.py`` runs them beside its own):
peers that are many users, that flood memory reports, or that claim memory they never give back.

* ``uids`` (N7e): 16 users (uids 20000-20015, each a child of its own; needs root) ask for the
  status document over and over, 4 connections each with 4 requests in flight, reading every
  reply: each user held to its own share would take 16 shares together;
* ``reports`` (N2): one idle client of the ``memory`` feature sends ``working_set`` reports with
  a new ``resident`` figure each, 256 in a write, as fast as the daemon reads them;
* ``liar`` (N4b): an idle client says it keeps 12 GiB on the 16 GiB card and never answers
  ``evict``; its second connection asks for 6 GiB and so waits for that eviction, asking again
  whenever it is refused; the liar says its figures again every few seconds. The probe, a plain
  client that needs no room, must be granted all along.

Each script takes (socket path, seconds, metrics port) and prints "attacking" once under way,
then what it got, as attack.py expects.
"""

from __future__ import annotations

ATTACKERS = {
    "uids": """
import os, socket, sys, threading, time
path, seconds = sys.argv[1], float(sys.argv[2])
if os.geteuid() != 0:
    print("attacking", flush=True)
    print("skipped: needs root to be 16 users", flush=True)
    sys.exit(0)
end = time.monotonic() + seconds
read_end, write_end = os.pipe()
children = []
for i in range(16):
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        os.setgroups([]); os.setgid(20000 + i); os.setuid(20000 + i)
        answered = []
        def read():
            s = socket.socket(socket.AF_UNIX)
            s.connect(path)
            f = s.makefile("rb")
            s.sendall(b'{"op":"hello","version":1}\\n')
            f.readline()
            s.sendall(b'{"op":"status"}\\n' * 4)
            while time.monotonic() < end:
                f.readline()
                answered.append(1)
                s.sendall(b'{"op":"status"}\\n')
        threads = [threading.Thread(target=read, daemon=True) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(max(0.0, end + 10 - time.monotonic()))
        os.write(write_end, b"%d\\n" % len(answered))
        os._exit(0)
    children.append(pid)
os.close(write_end)
print("attacking", flush=True)
with os.fdopen(read_end) as counts:
    documents = sum(int(line) for line in counts)
for pid in children:
    os.waitpid(pid, 0)
print(f"{documents:,} documents read by 16 uids", flush=True)
""",
    "reports": """
import json, socket, sys, threading, time
path, seconds = sys.argv[1], float(sys.argv[2])
s = socket.socket(socket.AF_UNIX)
s.connect(path)
f = s.makefile("rb")
s.sendall(b'{"op":"hello","version":1,"features":["memory"]}\\n')
f.readline()
s.sendall(b'{"op":"register","name":"reporter","evict":"vmm","working_set":1073741824}\\n')
f.readline()
end = time.monotonic() + seconds
answered = []
def read():
    while f.readline():
        answered.append(1)
threading.Thread(target=read, daemon=True).start()
print("attacking", flush=True)
sent = 0
while time.monotonic() < end:
    burst = b"".join(b'{"op":"working_set","bytes":1073741824,"resident":%d,"host":0}\\n'
                     % ((8 << 30) - (sent + i) % 4096 * 4096) for i in range(256))
    s.sendall(burst)
    sent += 256
print(f"{sent:,} reports sent, {len(answered):,} answered", flush=True)
""",
    "liar": """
import json, socket, sys, threading, time
path, seconds = sys.argv[1], float(sys.argv[2])
GiB = 1 << 30
def connect(name, working_set):
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    f = s.makefile("rb")
    s.sendall(b'{"op":"hello","version":1,"features":["memory"]}\\n')
    f.readline()
    s.sendall(json.dumps({"op": "register", "name": name, "evict": "vmm",
                          "working_set": working_set}).encode() + b"\\n")
    f.readline()
    return s, f
liar, liar_lines = connect("liar", 12 * GiB)
liar.sendall(b'{"op":"acquire"}\\n')
liar_lines.readline()
report = b'{"op":"working_set","bytes":%d,"resident":%d,"host":0}\\n' % (12 * GiB, 12 * GiB)
liar.sendall(report + b'{"op":"release"}\\n')
waiter, waiter_lines = connect("second", 6 * GiB)
end = time.monotonic() + seconds
asked, refused, granted = [], [], []
def drain():
    for line in liar_lines:
        if b'"evict"' in line:
            asked.append(1)
def wait():
    waiter.sendall(b'{"op":"acquire"}\\n')
    for line in waiter_lines:
        if b'"room"' in line:
            refused.append(1)
            waiter.sendall(b'{"op":"acquire"}\\n')
        elif b'"grant"' in line:
            granted.append(1)
            waiter.sendall(b'{"op":"release"}\\n{"op":"acquire"}\\n')
threading.Thread(target=drain, daemon=True).start()
threading.Thread(target=wait, daemon=True).start()
print("attacking", flush=True)
while time.monotonic() < end:
    time.sleep(min(2.0, max(0.0, end - time.monotonic())))
    liar.sendall(report)  # its figures again: no wait may start over for them
print(f"{len(asked)} evictions asked of the liar, the waiter refused {len(refused)} and "
      f"granted {len(granted)} times", flush=True)
""",
}

PHASES = {"uids": "16 uids reading status (N7e)", "reports": "memory report flood (N2)",
          "liar": "an idle liar blocking room (N4b)"}
