# supervisor: owns one node's torchrun for the whole run, independent of any SSH channel.
# Forked off the launch session by boot.py and detached (or run as `python supervisor.py
# RUNDIR`). It starts torchrun in its own session with one pipe as stdout and stderr (or a
# raw pty with spec "tty": ranks then see a terminal), copies what arrives byte for byte to
# RUNDIR/node.log, records state.json, and on SIGTERM (graceful) or SIGUSR1 (immediate)
# stops exactly this node's processes: torchrun's process group plus every process carrying
# this node's run marker. Its last act is exit.json. Ranks start through rank.py, which
# line-buffers them: one write per line.
# When node.log cannot grow (its disk is full), the node is stopped and fails with that reason:
# output that cannot be kept would otherwise vanish silently. A small reserve file, deleted
# then, leaves room for exit.json on the full disk.
import errno
import fcntl
import pty
import select
import subprocess
import tty

PUMP_BYTES = 1 << 20
PIPE_BYTES = 1 << 20  # a bigger pipe buffer: fewer wakeups for a chatty node
F_SETPIPE_SZ = 1031  # fcntl.F_SETPIPE_SZ, Linux only, named in Python 3.10+
RESERVE_BYTES = 64 * 1024
IDLE_WAIT = 1.0  # the loop's longest sleep: output, signals, torchrun's exit and aborts wake it
_DISK_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


class Supervisor(object):
    def __init__(self, rundir):
        self.rundir = rundir
        self.spec = read_json(os.path.join(rundir, "spec.json"))
        self.stop_signal = None
        self.proc = None
        self.master = None
        self.log = None
        self.log_full = None  # why node.log cannot grow (disk full), once it cannot
        self.wake = None  # read end of the pipe that signals and the peers' aborts write to
        self.peers = Peers(self.spec)
        self.started = time.time()

    def path(self, name):
        return os.path.join(self.rundir, name)

    def _env(self):
        env = dict(os.environ)
        env_file = self.path("env.json")
        extra = read_json(env_file) or {}
        try:
            os.unlink(env_file)  # secrets live on only in the processes that need them
        except OSError:
            pass
        env.update(extra)
        env["SSHDDP_RUN_ID"] = self.spec["run_id"]
        env["SSHDDP_NODE_RANK"] = str(self.spec["node_rank"])
        env[MARK_VAR] = self.spec["mark"]
        return env

    def _on_signal(self, signum, frame):
        if self.stop_signal != signal.SIGUSR1:
            self.stop_signal = signum

    def start(self):
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
            signal.signal(sig, self._on_signal)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        self._wake_on_events()
        self.log = os.open(self.path("node.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self._reserve()
        self.master, slave = self._output()
        os.set_blocking(self.master, False)
        argv = list(self.spec["argv"])
        argv[0] = sys.executable  # the host's configured interpreter, resolved by the shell
        if "--no-python" in argv:  # ... then the rank shim, in this run directory
            at = argv.index("--no-python")
            argv[at + 1 : at + 3] = [sys.executable, self.path("rank.py")]
        try:
            self.proc = subprocess.Popen(
                argv,
                cwd=self.spec.get("cwd") or None,
                env=self._env(),
                stdin=subprocess.DEVNULL,
                stdout=slave,
                stderr=slave,
                start_new_session=True,
            )
        except OSError as exc:
            self.write_log(("sshddp: cannot start %s: %s\n" % (argv[0], exc)).encode())
            self.finish("failed", None, "cannot start torchrun: %s" % exc)
            return False
        finally:
            os.close(slave)
        atomic_write_json(
            self.path("state.json"),
            {
                "state": "running",
                "supervisor_pid": os.getpid(),
                "supervisor_start": start_time(os.getpid()),
                "pid": self.proc.pid,
                "pgid": self.proc.pid,
                "started": self.started,
            },
        )
        return True

    def _wake_on_events(self):
        """Let the loop sleep until something happens: a signal (SIGCHLD included: torchrun
        exited) or a peer's abort writes a byte to a pipe it waits on with the output. An
        idle node then costs its host one wakeup a second, not fifty."""
        read, write = os.pipe()
        os.set_blocking(read, False)
        os.set_blocking(write, False)
        try:
            signal.signal(signal.SIGCHLD, _ignore)
            signal.set_wakeup_fd(write, warn_on_full_buffer=False)
        except ValueError:  # not the main thread (in-process tests): poll as before
            os.close(read)
            os.close(write)
            return

        def wake():
            try:
                os.write(write, b"!")
            except OSError:
                pass

        self.wake = read
        self.peers.on_abort = wake

    def _output(self):
        """(read end, write end) of the node's output: a pipe, or a raw pty."""
        if self.spec.get("tty"):
            master, slave = pty.openpty()
            tty.setraw(slave)  # bytes pass unchanged: no CR added, no echo, no signal keys
            return master, slave
        read, write = os.pipe()
        try:
            fcntl.fcntl(read, F_SETPIPE_SZ, PIPE_BYTES)
        except OSError:  # above /proc/sys/fs/pipe-max-size for this user: keep the default
            pass
        return read, write

    def reap(self):
        if self.proc is not None:
            self.proc.poll()
        self.pump(0)

    def pump(self, timeout):
        """Copy what the pipe or pty holds to node.log; False once no writer is left.

        Drain it non-blocking up to 1 MB per wakeup and write that in one go (a pty read
        returns at most ~4 KB: one select per read would cap a chatty rank's output).
        """
        if self.master is None:
            return False
        watched = [self.master] if self.wake is None else [self.master, self.wake]
        ready, _, _ = select.select(watched, [], [], timeout)
        if self.wake in ready:
            try:
                os.read(self.wake, 4096)
            except OSError:
                pass
        if self.master not in ready:
            return True
        chunks, size, alive = [], 0, True
        while size < PUMP_BYTES:
            try:
                data = os.read(self.master, 1 << 16)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno != errno.EIO:
                    raise
                data = b""
            if not data:
                alive = False
                break
            chunks.append(data)
            size += len(data)
        self.write_log(b"".join(chunks))
        if not alive:
            os.close(self.master)
            self.master = None
        return alive

    def write_log(self, data):
        """Append to node.log; on a full disk, note why and drop output from then on."""
        if self.log_full is not None:
            return
        try:
            while data:
                data = data[os.write(self.log, data) :]
        except OSError as exc:
            if exc.errno not in _DISK_FULL:
                raise
            self.log_full = (
                "the disk of %s is full (%s): node.log cannot grow, so the node was stopped"
                % (self.rundir, exc.strerror)
            )
            self._unreserve()

    def _reserve(self):
        try:
            with open(self.path("reserve"), "wb") as fh:
                fh.write(b"\0" * RESERVE_BYTES)
        except OSError:
            self._unreserve()  # no room even for that: exit.json will try its luck

    def _unreserve(self):
        try:
            os.unlink(self.path("reserve"))
        except OSError:
            pass

    def drain(self):
        """After the last process of the node is gone: copy every remaining byte."""
        while self.pump(0.05):
            pass

    def loop(self):
        wait = 0.02 if self.wake is None else IDLE_WAIT
        while True:
            rc = self.proc.poll()
            if rc is not None:
                return rc
            if self.stop_signal is not None or self.peers.abort is not None or self.log_full:
                return None
            if not self.pump(wait):
                time.sleep(0.02)

    def stop_reason(self, default):
        try:
            with open(self.path("stop-reason")) as fh:
                return fh.read().strip() or default
        except OSError:
            return default

    def run(self):
        if not self.start():
            self.peers.start()
            self.peers.report("failed", "torchrun did not start")
            self.peers.wait_others()
            return
        self.peers.start()
        rc = self.loop()
        if rc is None:
            grace = 0 if self.stop_signal == signal.SIGUSR1 else float(self.spec.get("grace", 10))
            kill_run(self.proc.pid, self.spec["mark"], grace, self.reap, self.hurry)
            rc = self.proc.wait()
            self.drain()
            default = "stopped: " + self.peers.abort if self.peers.abort else "stopped on request"
            state, reason = "stopped", self.stop_reason(default)
            if self.log_full and not self.peers.abort and self.stop_signal is None:
                state, reason = "failed", self.log_full
        else:
            # torchrun is gone; children that escaped into their own session must not outlive it.
            kill_run(self.proc.pid, self.spec["mark"], 0, self.reap)
            self.drain()
            state = "succeeded" if rc == 0 else "failed"
            reason = "" if rc == 0 else _describe(rc)
            if self.log_full:  # a node whose output was cut short never passes as complete
                state, reason = "failed", self.log_full
        self.finish(state, rc, reason)
        self.peers.report(state, reason)
        self.peers.wait_others()

    def hurry(self):
        return self.stop_signal == signal.SIGUSR1

    def finish(self, state, rc, reason):
        self._unreserve()
        result = {
            "state": state,
            "returncode": rc,
            "reason": reason,
            "started": self.started,
            "ended": time.time(),
            "node_rank": self.spec["node_rank"],
        }
        if rc is not None and rc < 0:
            result["signal"] = _signame(-rc)
        try:
            atomic_write_json(self.path("exit.json"), result)
        except OSError:
            pass  # a full disk even after the reserve went: the peers still hear the reason


def _ignore(signum, frame):
    pass


def _signame(num):
    try:
        return signal.Signals(num).name
    except ValueError:
        return "signal %d" % num


def _describe(rc):
    if rc < 0:
        return "torchrun was killed by %s" % _signame(-rc)
    return "torchrun exited with code %d" % rc


def run_supervisor(rundir):
    os.umask(0o077)
    Supervisor(rundir).run()
