"""Progress beacons for jobs launched by ddprun.

Tell ddprun that training moves, so that a rank that hangs is found and its
stack is shown::

    import ddprun

    for step, batch in enumerate(loader):
        ...
        ddprun.progress(step)

Under ddprun, each call sends a small UDP datagram to the local ddprun agent
(at most one every 0.1 s). Anywhere else, every call does nothing. The module
needs nothing but the standard library, never raises out of its functions or
its import, and never blocks: a beacon that cannot be sent is dropped.

Importing it under ddprun also registers a faulthandler dump of all threads on
SIGUSR2 (unless the program already handles SIGUSR2), so ddprun can show where
a hung rank is stuck.
"""

import operator
import os
import signal
import socket
import threading
import time

try:
    import faulthandler
except Exception:  # a Python built without it
    faulthandler = None

__all__ = ["progress", "phase"]

# At most one step datagram per this many seconds (per process).
_STEP_INTERVAL_S = 0.1
# Steps and microsecond counts must fit the agent's 64-bit integers.
_MAX_INT64 = 2 ** 63 - 1
# Bounds that keep a datagram far below the agent's 256-byte limit.
_MAX_TOKEN_CHARS = 64
_MAX_SMALL_INT_DIGITS = 9
_HEX_DIGITS = frozenset("0123456789abcdefABCDEF")
_DECIMAL_DIGITS = frozenset("0123456789")


def progress(step=None, busy=None):
    """Report that training made progress.

    step: the global step just finished, an int >= 0; when None, ddprun counts
        the calls made with no step (1, 2, ...). Any other value makes the call
        do nothing.
    busy: seconds this rank spent on its own work since its previous call,
        leaving out waits for other ranks (collectives); None when unknown.

    At most one beacon is sent per 0.1 s; the next one that goes out carries
    the newest step and the busy time of all calls since the previous one. A
    step held back is sent when the 0.1 s are over, even if no call follows (a
    rank that hangs right after it), so that ddprun names its real last step.
    """
    sender = _sender
    if sender is None:
        return
    try:
        sender.progress(step, busy)
    except Exception:
        pass


def phase(name=None):
    """Announce a phase that may be slow: a checkpoint, an evaluation, setup.

    The beacon goes out at once and lets the next progress() take as long as
    the job's timeouts.progress_start. The name is for the reader of the code;
    it is not sent.
    """
    sender = _sender
    if sender is None:
        return
    try:
        sender.phase()
    except Exception:
        pass


class _Sender(object):
    """The beacon state of this process; exists only when the env is valid."""

    def __init__(self, address, prefix):
        self.address = address  # (numeric IPv4 string, port): never a DNS lookup
        self.prefix = prefix  # b"ddprun1 <token> <round> <local_rank> "
        self.stack_signal = 0
        self.pid = os.getpid()
        self.sock = None  # created by the first send
        self.lock = threading.Lock()
        self.calls_without_step = 0
        self.last_step_sent = 0
        self.last_step_time = None  # time.monotonic() of the last step datagram
        self.pending_busy_us = 0
        self.pending_busy_known = True
        self.pending_step = None  # a step held back by the interval, not sent yet
        self.flush_timer = None  # sends pending_step once the interval is over

    def progress(self, step, busy):
        if os.getpid() != self.pid:
            return  # a forked child: its beacons would speak for its parent
        if step is not None:
            step = _as_step(step)
            if step is None:
                return
        busy_us = _as_busy_us(busy)
        # Never wait: a thread that finds another one here drops its beat (the
        # other is reporting right now), and a signal handler cannot deadlock.
        if not self.lock.acquire(False):
            return
        try:
            if step is None:
                self.calls_without_step += 1
                step = self.calls_without_step
            if busy_us is None:
                self.pending_busy_known = False
            else:
                self.pending_busy_us = min(self.pending_busy_us + busy_us, _MAX_INT64)
            now = time.monotonic()
            if self.last_step_time is not None and now - self.last_step_time < _STEP_INTERVAL_S:
                self.pending_step = step
                if self.flush_timer is None:
                    wait = self.last_step_time + _STEP_INTERVAL_S - now
                    self.flush_timer = threading.Timer(wait, self.flush)
                    self.flush_timer.daemon = True
                    self.flush_timer.start()
                return
            busy_field = self.take_pending(now, step)
        finally:
            self.lock.release()
        self.send(b"step", step, busy_field)

    def take_pending(self, now, step):
        """Marks `step` sent now; the busy field to send with it. Under the lock."""
        busy_field = self.pending_busy_us if self.pending_busy_known else -1
        self.last_step_time = now
        self.last_step_sent = step
        self.pending_step = None
        self.pending_busy_us = 0
        self.pending_busy_known = True
        return busy_field

    def flush(self):
        """The timer's thread: sends the step held back, unless a call sent a newer one."""
        if os.getpid() != self.pid:
            return
        with self.lock:
            self.flush_timer = None
            step = self.pending_step
            if step is None:
                return
            busy_field = self.take_pending(time.monotonic(), step)
        self.send(b"step", step, busy_field)

    def phase(self):
        if os.getpid() != self.pid:
            return
        # A step held back goes first: the phase begins after it.
        pending = None
        if self.lock.acquire(False):
            try:
                if self.pending_step is not None:
                    pending = (self.pending_step, self.take_pending(time.monotonic(), self.pending_step))
            finally:
                self.lock.release()
        if pending is not None:
            self.send(b"step", pending[0], pending[1])
        self.send(b"phase", self.last_step_sent, -1)

    def send(self, kind, step, busy_us):
        data = b"%s%s %d %d %d" % (self.prefix, kind, step, busy_us, self.stack_signal)
        sock = self.sock
        if sock is None:
            sock = self.sock = _open_socket(self.address)
            if sock is None:
                return
        try:
            sock.send(data)
        except OSError:
            pass  # EAGAIN (buffer full), ECONNREFUSED (no agent), ...: the beat is dropped


def _open_socket(address):
    """A non-blocking UDP socket connected to `address`, or None."""
    try:
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    except OSError:
        return None
    try:
        sock.setblocking(False)
        sock.connect(address)  # UDP: only records the peer; numeric, so no lookup
        return sock
    except OSError:
        sock.close()
        return None


def _as_step(step):
    """`step` as an int in [0, 2**63), or None."""
    if isinstance(step, bool):
        return None
    try:
        value = operator.index(step)
    except Exception:
        return None
    if value < 0 or value > _MAX_INT64:
        return None
    return value


def _as_busy_us(busy):
    """`busy` seconds as whole microseconds, or None when unknown or invalid."""
    if busy is None or isinstance(busy, bool):
        return None
    try:
        seconds = float(busy)
    except Exception:
        return None
    if not seconds >= 0.0 or seconds > 1e12:  # also rejects NaN
        return None
    return int(round(seconds * 1e6))


def _parse_small_int(text):
    if not text or len(text) > _MAX_SMALL_INT_DIGITS or not set(text) <= _DECIMAL_DIGITS:
        return None
    return int(text)


def _parse_address(text):
    """"127.0.0.1:<port>" as (host, port), or None."""
    host, colon, port_text = text.rpartition(":")
    if not colon or not host or not port_text or len(port_text) > 5:
        return None
    if not set(port_text) <= _DECIMAL_DIGITS:
        return None
    port = int(port_text)
    if not 1 <= port <= 65535:
        return None
    try:
        socket.inet_pton(socket.AF_INET, host)
    except (OSError, ValueError):
        return None
    return (host, port)


def _read_env(env):
    """(address, datagram prefix) from the agent's variables, or None."""
    address = _parse_address(env.get("DDPRUN_PROGRESS_ADDR", ""))
    token = env.get("DDPRUN_PROGRESS_TOKEN", "")
    round_ = _parse_small_int(env.get("TORCHELASTIC_RESTART_COUNT", ""))
    local_rank = _parse_small_int(env.get("LOCAL_RANK", ""))
    if address is None or round_ is None or local_rank is None:
        return None
    if not token or len(token) > _MAX_TOKEN_CHARS or not set(token) <= _HEX_DIGITS:
        return None
    prefix = ("ddprun1 %s %d %d " % (token, round_, local_rank)).encode("ascii")
    return address, prefix


# The open stacks file; faulthandler writes to its descriptor, so it stays open.
_stacks_fd = None


def _register_stack_dump(path):
    """Makes SIGUSR2 dump all threads into `path`; returns the signal, or 0."""
    global _stacks_fd
    usr2 = getattr(signal, "SIGUSR2", None)
    if not path or usr2 is None or faulthandler is None or not hasattr(faulthandler, "register"):
        return 0
    # A program that handles SIGUSR2 itself (or ignores it) keeps its handler.
    if signal.getsignal(usr2) is not signal.SIG_DFL:
        return 0
    flags = (os.O_WRONLY | os.O_APPEND | os.O_CREAT
             | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0))
    fd = os.open(path, flags, 0o644)
    try:
        faulthandler.register(usr2, file=fd, all_threads=True, chain=False)
    except Exception:
        os.close(fd)
        raise
    _stacks_fd = fd
    return int(usr2)


def _after_fork_in_child():
    global _sender
    try:
        _sender = None
        if _stacks_fd is not None:
            faulthandler.unregister(signal.SIGUSR2)
    except Exception:
        pass


_sender = None


def __getattr__(name):
    """`import ddprun` then `ddprun.lightning.ProgressCallback()`, as the README writes it: the
    submodule is imported on first use, so `import ddprun` alone never imports Lightning."""
    if name == "lightning":
        import importlib
        return importlib.import_module(__name__ + ".lightning")
    raise AttributeError("module %r has no attribute %r" % (__name__, name))


def _start():
    global _sender
    config = _read_env(os.environ)
    if config is None:
        return
    sender = _Sender(*config)
    try:
        sender.stack_signal = _register_stack_dump(os.environ.get("DDPRUN_STACKS_FILE", ""))
    except Exception:
        sender.stack_signal = 0
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_after_fork_in_child)
    _sender = sender
    sender.send(b"hello", 0, -1)


try:
    _start()
except Exception:
    pass
