# Shared helpers of the remote scripts: atomic state files and precise process teardown.
# Stdlib only, Python 3.8+. Prepended to every script sent to a host.
import json
import os
import signal
import sys
import time

MARK_VAR = "SSHDDP_NODE_MARK"
AGENT_GRACE = 0.2  # seconds torchrun may outlive its ranks at teardown


def atomic_write_json(path, obj):
    tmp = "%s.tmp.%d" % (path, os.getpid())
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(obj, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def read_json(path):
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def home_path(path):
    """A path on this host as torchrun will see it: ``~`` expanded, relative to $HOME (the
    run's cwd for a script that lives on the host), whatever this process's cwd is."""
    return os.path.join(os.path.expanduser("~"), os.path.expanduser(path))


def listdir(path):
    try:
        return os.listdir(path)
    except OSError:
        return []


def emit(obj, stream=None):
    stream = stream or sys.stdout
    stream.write(json.dumps(obj) + "\n")
    stream.flush()


def _stat(pid):
    """(state, pgid, start time) of a process from /proc/PID/stat, or None when it is gone."""
    try:
        with open("/proc/%d/stat" % pid) as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return fields[0], int(fields[2]), int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def start_time(pid):
    """When the process started (clock ticks since boot): with its pid this names one
    process for good, whatever process later reuses the pid. None when it is gone."""
    st = _stat(pid)
    return st[2] if st else None


def _pgid(pid):
    st = _stat(pid)
    return st[1] if st else None


def _is_zombie(pid):
    st = _stat(pid)
    return st is None or st[0] in ("Z", "X")


def run_pids(pgid, mark):
    """Live pids of a node's run: its process group, and every process whose environment
    carries the node's run marker (so children that called setsid are found too)."""
    needle = ("%s=%s" % (MARK_VAR, mark)).encode()
    found = []
    me = os.getpid()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        pid = int(name)
        st = _stat(pid)
        if st is None or st[0] in ("Z", "X"):
            continue
        if pgid and st[1] == pgid:
            found.append(pid)
            continue
        try:
            with open("/proc/%s/environ" % name, "rb") as fh:
                env = fh.read()
        except OSError:
            continue
        if needle in env.split(b"\0"):
            found.append(pid)
    return found


def pid_alive(pid):
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not _is_zombie(pid)


def signal_all(pids, sig):
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:
            pass


def kill_run(pgid, mark, grace, reap=None, hurry=None):
    """SIGTERM every process of the node's run, SIGKILL what is left after ``grace`` s.

    ``reap`` (optional) is called while waiting so a parent can collect its own child.
    Returns the number of seconds it took.
    """
    start = time.time()
    pids = run_pids(pgid, mark)
    if grace > 0 and pids:
        signal_all(pids, signal.SIGTERM)
        workers_gone = None
        while pids and time.time() - start < grace and not (hurry and hurry()):
            time.sleep(0.02)
            if reap:
                reap()
            pids = run_pids(pgid, mark)
            # Once the ranks are gone, torchrun's own cleanup (seconds of Python teardown)
            # protects nothing: give it AGENT_GRACE, then kill it.
            if workers_gone is None and not [p for p in pids if _pgid(p) != pgid]:
                workers_gone = time.time()
            if workers_gone is not None and time.time() - workers_gone > AGENT_GRACE:
                break
    for _ in range(500):
        if not pids:
            break
        signal_all(pids, signal.SIGKILL)
        time.sleep(0.01)
        if reap:
            reap()
        pids = run_pids(pgid, mark)
    return time.time() - start
