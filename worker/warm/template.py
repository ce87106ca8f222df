"""ddprun's warm-start template (job.preload; runner/io/warm_template.h).

The agent starts this file with the interpreter and the interpreter options of job.command, in
the job's working folder and with the environment of its workers. It imports the modules of
job.preload, checks that a fork of it is safe, says so on its control socket, and then forks one
worker for every request. Each worker becomes what `python script.py` or `python -m module`
would be: its own environment, argv, folder, stdio, process group and seeds, and `__main__` run
as the interpreter runs it. This file is not on the workers' sys.path and imports nothing of
ddprun's: a worker that imports `ddprun` gets a fresh module that reads its own environment.

Protocol (SOCK_SEQPACKET on descriptor 3, one JSON object per message):
  agent -> template: {"module": bool, "target": "...", "preload": [...]} (first, once)
  template -> agent: {"ready": true, "import_s": S, "env_read": {...}} | {"ready": false, "reason": "..."}
  agent -> template: {"id": N, "agent": PID, "guardian": bool, "workers": [{"argv": [...], "orig_argv": [...],
                      "env": {...}, "cwd": "...", "nofile": [cur, max] | null}, ...]},
                     with SCM_RIGHTS [guardian (when "guardian")] + [stdout, stderr, go] per worker
  template -> agent: {"id": N, "started": [{"pid": PID} | {"error": "..."} | {"cold": "..."}, ...]},
                     one entry per worker of the request, in its order

A request's workers are forked together (each by a double fork, the middle processes first),
and the answer comes once all of them are reparented to the agent. A forked worker then waits
on its `go` descriptor: the agent writes one byte once it has adopted the pid, and closes it
unwritten when it has not (it took the template for hung, or is going away), so a worker whose
pid the agent does not know never runs job code.

A worker is what a cold start would be, module state included: while the template imports the
preloads it records which environment variables each module reads and sets (os.environ). A
worker whose variables differ from the template's in one a module read, and that ddprun cannot
set again in the worker (_REFRESH), starts cold ({"cold": why}); what the imports set in the
environment is set again in the worker (the worker's environment replaces the template's).
"""

import array
import json
import os
import signal
import socket
import struct
import sys
import time

_MAX_MESSAGE = 1 << 20


def _send(sock, obj):
    sock.send(json.dumps(obj).encode())


def _threads():
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return -1


def _open_fds(keep):
    """Open descriptors other than `keep`, as (fd, what it is)."""
    found = []
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return found
    for name in names:
        fd = int(name)
        if fd in keep:
            continue
        try:
            target = os.readlink("/proc/self/fd/%d" % fd)
            os.fstat(fd)
        except OSError:
            continue  # the descriptor listdir itself used, closed by now
        found.append((fd, target))
    return found


def _refusal(control_fd):
    """Why forking this process would not give a worker a cold start's state, or None."""
    threads = _threads()
    if threads != 1:
        return ("the preloaded modules left %d threads running in the template (a fork keeps only "
                "the one that forks; locks the others held stay locked)" % threads)
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            cuda_on = torch.cuda.is_initialized()
        except Exception:
            cuda_on = False
        if cuda_on:
            return "the preloaded modules initialised CUDA in the template (a CUDA context does not survive a fork)"
    stray = _open_fds({0, 1, 2, control_fd})
    if stray:
        return ("the preloaded modules left files open in the template, which every worker would "
                "share: %s" % ", ".join("%d -> %s" % item for item in stray[:5]))
    return None


def _worker_path0(config):
    """sys.path[0] as the cold interpreter sets it, or None when it adds none (-P, -I)."""
    if getattr(sys.flags, "safe_path", False) or sys.flags.isolated:
        return None
    if config["module"]:
        return os.getcwd()
    return os.path.dirname(os.path.realpath(config["target"]))


# --- What the imports take from the environment --------------------------------------------

class _EnvWatch:
    """Records, while the preloads are imported, which os.environ variables each module reads
    (a value looked up) and sets, and which modules walked the names ("*": what they do then
    depends only on which variables exist, unless they also read values, which is recorded
    too), by the module whose top level was running. Variables read from C (getenv) are not
    seen; docs/running.md says so."""

    def __init__(self):
        self.reads = {}     # name or "*" -> [module, ...]
        self.writers = {}   # name -> module
        # The environment the template was started with (a cold worker's exec gets its own):
        # what the interpreter changed at its start (LC_CTYPE, PEP 538) counts as written too.
        self.before = _exec_environment()
        for key in set(self.before) | set(os.environ):
            if self.before.get(key) != os.environ.get(key):
                self.writers[key] = "the interpreter's start-up"
        self.written = {}   # name -> value, or None when the imports removed it
        self._saved = {}

    @staticmethod
    def _importing():
        frame = sys._getframe(2)
        while frame is not None:
            if frame.f_code.co_name == "<module>":
                return frame.f_globals.get("__name__", "?")
            frame = frame.f_back
        return "?"

    def _note(self, table, key):
        module = self._importing()
        modules = table.setdefault(key, [])
        if module not in modules:
            modules.append(module)

    def start(self):
        environ_class = type(os.environ)
        watch = self
        for name in ("__getitem__", "__iter__", "__setitem__", "__delitem__"):
            self._saved[name] = environ_class.__dict__[name]
        getitem, iterate = self._saved["__getitem__"], self._saved["__iter__"]
        setitem, delitem = self._saved["__setitem__"], self._saved["__delitem__"]

        def watched_getitem(environ, key):
            watch._note(watch.reads, key)
            return getitem(environ, key)

        def watched_iter(environ):
            watch._note(watch.reads, "*")
            return iterate(environ)

        def watched_setitem(environ, key, value):
            watch.writers.setdefault(key, watch._importing())
            return setitem(environ, key, value)

        def watched_delitem(environ, key):
            watch.writers.setdefault(key, watch._importing())
            return delitem(environ, key)

        environ_class.__getitem__ = watched_getitem
        environ_class.__iter__ = watched_iter
        environ_class.__setitem__ = watched_setitem
        environ_class.__delitem__ = watched_delitem

    def stop(self):
        environ_class = type(os.environ)
        for name, function in self._saved.items():
            setattr(environ_class, name, function)
        after = dict(os.environ)
        for key in set(self.before) | set(after):
            if self.before.get(key) != after.get(key):
                self.written[key] = after.get(key)
                self.writers.setdefault(key, "?")


def _exec_environment():
    """The environment this process was started with (/proc/self/environ keeps it whatever
    os.environ became since), decoded as os.environ decodes it."""
    try:
        with open("/proc/self/environ", "rb") as f:
            entries = f.read().split(b"\0")
    except OSError:
        return dict(os.environ)
    found = {}
    for entry in entries:
        name, eq, value = entry.partition(b"=")
        if eq and name:
            found[os.fsdecode(name)] = os.fsdecode(value)
    return found


def _refresh_lightning_rank(module):
    # lightning/fabric/utilities/rank_zero.py (and lightning_fabric's), at import:
    #   rank_zero_only.rank = getattr(rank_zero_only, "rank", _get_rank() or 0)
    # on lightning_utilities' rank_zero_only (its own before lightning-utilities 0.10, which
    # then sets lightning_utilities' too); _get_rank reads RANK, LOCAL_RANK, SLURM_PROCID,
    # JSM_NAMESPACE_RANK, the first that is set.
    rank = module._get_rank() or 0
    module.rank_zero_only.rank = rank
    utilities = sys.modules.get("lightning_utilities.core.rank_zero")
    if utilities is not None:
        utilities.rank_zero_only.rank = rank


def _refresh_torchmetrics_rank(module):
    # torchmetrics/utilities/prints.py, at import, on its own rank_zero_only:
    #   rank_zero_only.rank = getattr(rank_zero_only, "rank", int(os.environ.get("LOCAL_RANK", 0)))
    module.rank_zero_only.rank = int(os.environ.get("LOCAL_RANK", 0))


_LIGHTNING_RANK_KEYS = ("RANK", "LOCAL_RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK")

# Modules whose import-time state from the environment ddprun sets again in each worker, as
# their own import would have set it from the worker's variables: the variables it covers, and
# how. A module that read any other variable that differs is not covered (the worker starts
# cold), so a new version that reads more is caught, not trusted.
_REFRESH = {
    "lightning.fabric.utilities.rank_zero": (_LIGHTNING_RANK_KEYS, _refresh_lightning_rank),
    "lightning_fabric.utilities.rank_zero": (_LIGHTNING_RANK_KEYS, _refresh_lightning_rank),
    "torchmetrics.utilities.prints": (("LOCAL_RANK",), _refresh_torchmetrics_rank),
}


def _covered(module, key):
    return module in _REFRESH and key in _REFRESH[module][0]


_watch = None  # the _EnvWatch of the preloads, once imported


def _differs_from_template(env):
    """Why a fork for `env` would not be what a cold start gives, or None."""
    changed = sorted(k for k in set(_watch.before) | set(env) if _watch.before.get(k) != env.get(k))
    for key in changed:
        modules = [m for m in _watch.reads.get(key, ()) if not _covered(m, key)]
        if modules:
            return ("%s read %s when the template imported it, and this worker's %s differs (%s, the "
                    "template's %s): a fork would keep the template's" %
                    (modules[0], key, key, _shown(env.get(key)), _shown(_watch.before.get(key))))
        if key in _watch.written:
            return ("%s set %s when the template imported it, and this worker's %s differs (%s, the "
                    "template's %s)" % (_watch.writers.get(key, "?"), key, key, _shown(env.get(key)),
                                        _shown(_watch.before.get(key))))
    # Variables that exist in one and not the other change what a walk of the names finds.
    walkers = _watch.reads.get("*", ())
    names = sorted(k for k in changed if (k in env) != (k in _watch.before))
    if names and walkers:
        return ("%s walked the environment's names when the template imported it, and this worker has "
                "other names (%s)" % (walkers[0], ", ".join(names[:4])))
    return None


def _shown(value):
    return "unset" if value is None else repr(value)


# --- Serving requests ----------------------------------------------------------------------

def _serve(config, ctrl):
    """Answers requests until the agent closes the socket. Returns (in a worker) its request,
    its descriptors [stdout, stderr, go, guardian or -1] and the report pipe's write end."""
    fd_size = array.array("i").itemsize
    while True:
        try:
            data, ancdata, _, _ = ctrl.recvmsg(_MAX_MESSAGE, socket.CMSG_SPACE(256 * fd_size))
        except InterruptedError:
            continue
        if not data:
            os._exit(0)  # the agent is gone or replaced us
        fds = array.array("i")
        for level, kind, payload in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(payload[: len(payload) - len(payload) % fd_size])
        fds = list(fds)
        request = None
        try:
            request = json.loads(data)
            workers = request["workers"]
            guardian = fds[0] if request.get("guardian") else -1
            mine = fds[1:] if request.get("guardian") else fds
            if len(mine) != 3 * len(workers):
                raise ValueError("%d descriptors for %d workers" % (len(mine), len(workers)))
        except Exception as error:
            for fd in fds:
                os.close(fd)
            _send(ctrl, {"id": request.get("id") if isinstance(request, dict) else None, "started": [],
                         "error": "a request the template cannot read: %s" % error})
            continue
        for worker in workers:
            worker["agent"] = request["agent"]
        in_worker, answers = _fork_batch(workers, mine, guardian)
        if in_worker is not None:
            return in_worker
        for fd in fds:
            os.close(fd)
        _send(ctrl, {"id": request["id"], "started": answers})


def _fork_batch(workers, fds, guardian):
    """Forks every worker of a request, each by a double fork: the middle process exits at once,
    so the worker is reparented to the agent (a child subreaper), which waits for it as for a
    cold one. The middles are all forked before any is waited for. Returns (None, answers) in
    the template, or ((request, descriptors, report), None) in a worker."""
    sys.stdout.flush()
    sys.stderr.flush()
    answers = [None] * len(workers)
    forked = []  # (index, middle pid, read end of its report)
    for index, worker in enumerate(workers):
        problem = _differs_from_template(worker["env"])
        if problem is not None:
            answers[index] = {"cold": problem}
            continue
        read_end, write_end = os.pipe()
        middle = os.fork()
        if middle == 0:
            try:
                os.close(read_end)
                for _, _, other in forked:
                    os.close(other)
                # Our own pid, taken before the fork: the worker's getppid() may already be the
                # agent's by the time it looks, if we have exited.
                worker["_middle"] = os.getpid()
                if os.fork() == 0:
                    mine = fds[3 * index:3 * index + 3] + [guardian]
                    return (worker, mine, write_end), None
            except BaseException:
                pass
            os._exit(0)
        os.close(write_end)
        forked.append((index, middle, read_end))
    for index, middle, read_end in forked:
        os.waitpid(middle, 0)
        report = b""
        while True:
            chunk = os.read(read_end, 4096)
            if not chunk:
                break
            report += chunk
        os.close(read_end)
        text = report.decode(errors="replace")
        if text.startswith("ok "):
            answers[index] = {"pid": int(text[3:])}
        else:
            answers[index] = {"error": text[4:] if text.startswith("err ") else
                              "the forked worker ended before it started"}
    return None, answers


def _become_worker(request, fds, report, ctrl):
    """In the worker: everything a cold start gives, in the order a cold start has it. `fds`:
    [stdout, stderr, go, guardian or -1]."""
    step = "setup"

    def fail(why):
        try:
            os.write(report, ("err " + why).encode())
        finally:
            os._exit(127)

    go = fds[2]
    try:
        # Our own process group, as a cold worker has (a stop reaches everything in it).
        step = "process group"
        os.setpgid(0, 0)
        # Registered with the guardian before any user code runs (runner/io/guardian.h).
        if fds[3] >= 0:
            os.write(fds[3], struct.pack("@ci", b"+", os.getpid()))
        # Wait until our parent has exited and we belong to the agent.
        step = "reparenting"
        deadline = time.monotonic() + 5.0
        while os.getppid() == request["_middle"]:
            if time.monotonic() > deadline:
                fail("the template's forked child did not exit")
            time.sleep(0.0002)
        if os.getppid() != request["agent"]:
            os._exit(137)  # the agent died: nothing would wait for us
        step = "stdio"
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(fds[0], 1)
        os.dup2(fds[1], 2)
        step = "folder"
        os.chdir(request["cwd"])
        if request.get("nofile"):
            import resource
            resource.setrlimit(resource.RLIMIT_NOFILE, tuple(request["nofile"]))
        # Signals as the interpreter sets them at start; the template changed none but SIGCHLD.
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, [])
        # Nothing of the template's crosses but stdio: the control socket, the descriptors
        # received, the report pipe and `go` (closed below, once used).
        sock_fd = ctrl.detach()
        os.close(sock_fd)
        for name in os.listdir("/proc/self/fd"):
            fd = int(name)
            if fd > 2 and fd not in (report, go):
                try:
                    os.close(fd)
                except OSError:
                    pass  # the listing's own descriptor
        # The environment, wholesale: what the cold worker's exec would have given, then what
        # the preloads' imports set in it (a cold worker's imports set the same).
        step = "environment"
        os.environ.clear()
        os.environ.update(request["env"])
        for key, value in _watch.written.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        sys.argv = list(request["argv"])
        sys.orig_argv = list(request.get("orig_argv", sys.argv))
        _fresh_seeds()
        step = "module state"
        for name, (_, refresh) in _REFRESH.items():
            module = sys.modules.get(name)
            if module is not None:
                refresh(module)
        # A module that imported ddprun during the preload would have read the template's
        # environment; the worker's own import must read its own.
        for name in [n for n in sys.modules if n == "ddprun" or n.startswith("ddprun.")]:
            del sys.modules[name]
    except OSError as error:
        fail("%s: %s" % (step, error.strerror or error))
    except Exception as error:
        fail("%s: %s" % (step, error))
    os.write(report, ("ok %d" % os.getpid()).encode())
    os.close(report)
    # Job code runs only once the agent has adopted this pid (a byte on `go`); EOF means it
    # will not, and nothing of the job may run here.
    while True:
        try:
            said = os.read(go, 1)
            break
        except InterruptedError:
            continue
    os.close(go)
    if said != b"g":
        os._exit(137)


def _fresh_seeds():
    """Each cold worker draws its own seeds at start; a fork would share the template's."""
    import random
    random.seed()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        try:
            numpy.random.seed()
        except Exception:
            pass
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            torch.seed()
        except Exception:
            pass


def _run_main(config):
    """Runs the script or module as `__main__`, as the interpreter would, and exits as it would."""
    import types
    main = types.ModuleType("__main__")
    # What the interpreter's own __main__ holds before the script runs.
    main.__dict__["__builtins__"] = __builtins__
    main.__dict__["__annotations__"] = {}
    sys.modules["__main__"] = main
    path0 = _worker_path0(config)
    if path0 is not None:
        sys.path[0] = path0
    if config["module"]:
        import runpy
        sys.argv[0] = "-m"
        runpy._run_module_as_main(config["target"], alter_argv=True)
        return
    import importlib.machinery
    script = config["target"]
    path = os.path.abspath(script)
    with open(path, "rb") as source_file:
        source = source_file.read()
    main.__dict__.update(__file__=path, __cached__=None, __package__=None, __spec__=None,
                         __loader__=importlib.machinery.SourceFileLoader("__main__", path))
    code = compile(source, path, "exec", dont_inherit=True)
    del source
    exec(code, main.__dict__)


def _start_template():
    control_fd = 3
    ctrl = socket.socket(fileno=control_fd)
    config = json.loads(ctrl.recv(_MAX_MESSAGE))
    # The preloads resolve as the worker's imports will: its sys.path[0], not this file's folder.
    path0 = _worker_path0(config)
    if path0 is not None:
        sys.path[0] = path0
    global _watch
    _watch = _EnvWatch()
    began = time.monotonic()
    try:
        import importlib
        _watch.start()
        try:
            for name in config["preload"]:
                importlib.import_module(name)
        finally:
            _watch.stop()
    except BaseException as error:
        _send(ctrl, {"ready": False, "reason": "cannot import the preloaded modules: %s: %s"
                                               % (type(error).__name__, error)})
        os._exit(1)
    import_s = time.monotonic() - began
    why = _refusal(control_fd)
    if why is not None:
        _send(ctrl, {"ready": False, "reason": why})
        os._exit(1)
    # What the template's objects are now stays out of every worker's garbage collections: a
    # collection would otherwise walk, and so copy, pages the workers share with the template.
    import gc
    gc.freeze()
    # Said in the template's log, for whoever wonders why a worker started cold.
    for key, modules in sorted(_watch.reads.items()):
        print("the imports read %s: %s" % ("the environment's names" if key == "*" else key,
                                          ", ".join(m + (" (set again in each worker)" if _covered(m, key) else "")
                                                    for m in modules)))
    for key, value in sorted(_watch.written.items()):
        print("the imports %s %s (%s): set so in each worker too" % ("removed" if value is None else "set", key,
                                                                     _watch.writers.get(key, "?")))
    sys.stdout.flush()
    # Forked children that exit are reaped by waitpid in _fork_batch; nothing else forks here.
    _send(ctrl, {"ready": True, "import_s": import_s})
    return config, ctrl


def _leave(code):
    """How a failing warm worker exits: what the interpreter does first at exit (join the
    threads that are not daemons, run the atexit handlers, flush stdout and stderr), then
    os._exit. The rest of an interpreter's teardown (finalizers of the objects still alive,
    freeing every module) is skipped: in a process forked from the template it touches, and so
    copies, most of the template's pages, seconds for torch and Lightning while the job waits
    for this exit. DDPRUN_WARM_FAST_EXIT=0 in the job's environment keeps the full teardown."""
    if os.environ.get("DDPRUN_WARM_FAST_EXIT", "1") == "0":
        sys.exit(code)
    try:
        import threading
        threading._shutdown()
    except BaseException:
        pass
    try:
        import atexit
        atexit._run_exitfuncs()
    except BaseException:
        pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            pass
    os._exit(code)


if __name__ == "__main__":
    _config, _ctrl = _start_template()
    _request, _fds, _report = _serve(_config, _ctrl)
    # In the worker from here on; the template's names above stay in this module's globals,
    # which the worker's __main__ (a new module) does not see.
    _become_worker(_request, _fds, _report, _ctrl)
    del _request, _fds, _report, _ctrl
    try:
        _run_main(_config)
    except SystemExit as _exit:
        if _exit.code is None or _exit.code == 0:
            raise
        # What the interpreter does with SystemExit: an int is the exit status, anything else
        # is printed to stderr and the status is 1.
        if isinstance(_exit.code, int):
            _status = _exit.code & 0xFF
        else:
            _status = 1
            try:
                print(_exit.code, file=sys.stderr)
            except BaseException:
                pass
        del _exit
        _leave(_status)
    except BaseException as _error:
        # Printed as the interpreter prints an uncaught exception, without this file's frames.
        _tb = _error.__traceback__
        while _tb is not None and _tb.tb_frame.f_code.co_filename in (__file__, getattr(sys.modules.get("runpy"), "__file__", "")):
            _tb = _tb.tb_next
        # The interpreter prints the exception's own traceback, not the one it is given.
        _error.__traceback__ = _tb
        sys.excepthook(type(_error), _error, _tb)
        if isinstance(_error, KeyboardInterrupt):
            sys.stdout.flush()
            sys.stderr.flush()
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        del _error, _tb
        _leave(1)
