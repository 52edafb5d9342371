"""`perch serve` started for a script (scripts/soak, scripts/bench-prefill-memory): on a port
the system picks, read from its log, whose later lines are drained so a full pipe never
stalls the server; and a process's memory figures from /proc."""
import re
import subprocess
import threading


def start(perch, *args, env=None):
    """`perch [args before serve] serve ARGS --port 0`: (the process, its port)."""
    proc = subprocess.Popen([perch, *args, "--port", "0"], stderr=subprocess.PIPE, text=True, env=env)
    port = None
    for line in proc.stderr:
        m = re.search(r"http://127\.0\.0\.1:(\d+)", line)
        if m:
            port = int(m.group(1))
            break
    assert port, "perch serve did not start"
    threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
    return proc, port


def status_mb(pid, key):
    """A /proc/PID/status figure in MB (`VmRSS:`, `VmHWM:`)."""
    for line in open(f"/proc/{pid}/status"):
        if line.startswith(key):
            return int(line.split()[1]) / 1024
    return 0.0
