"""Run a command next to a stand-in for TensorBoard: ``python x11_trap.py TIMEOUT COMMAND...``.

Meant to run in a private network namespace (``unshare --net``), so that no other process on the
machine meets the trap: brings up loopback, listens on 127.0.0.1:6006 (X display :6 to Xlib),
accepts connections and never answers them, runs COMMAND without HWLOC_COMPONENTS in its
environment, and prints one JSON line: exit code (None if it ran past TIMEOUT seconds) and how
many connections the listener accepted.
"""

import json
import os
import socket
import subprocess
import sys
import threading

subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
listener = socket.socket()
listener.bind(("127.0.0.1", 6006))
listener.listen(16)
held: list[socket.socket] = []  # accepted and never answered, like an X server that never sends its handshake


def accept():
    while True:
        conn, _ = listener.accept()
        held.append(conn)


threading.Thread(target=accept, daemon=True).start()
env = {k: v for k, v in os.environ.items() if k != "HWLOC_COMPONENTS"}
try:
    rc: int | None  # None: timed out
    proc = subprocess.run(sys.argv[2:], env=env, capture_output=True, text=True, timeout=float(sys.argv[1]))
    rc, out = proc.returncode, proc.stdout + proc.stderr
except subprocess.TimeoutExpired as e:
    rc, out = None, str(e.stdout or "")
print(json.dumps({"rc": rc, "connections": len(held), "output": out[-2000:]}), flush=True)
