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
  template -> agent: {"ready": true, "import_s": S} | {"ready": false, "reason": "..."}
  agent -> template: {"argv": [...], "env": {...}, "cwd": "...", "nofile": [cur, max] | null,
                      "agent": PID}, with SCM_RIGHTS [stdin, stdout, stderr, guardian | none]
  template -> agent: {"pid": PID} | {"error": "..."}
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


def _serve(config, ctrl):
    """Answers spawn requests until the agent closes the socket. Returns in a worker."""
    fd_size = array.array("i").itemsize
    while True:
        try:
            data, ancdata, _, _ = ctrl.recvmsg(_MAX_MESSAGE, socket.CMSG_SPACE(4 * fd_size))
        except InterruptedError:
            continue
        if not data:
            os._exit(0)  # the agent is gone or replaced us
        fds = array.array("i")
        for level, kind, payload in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(payload[: len(payload) - len(payload) % fd_size])
        request = json.loads(data)
        started = _fork_worker(request, list(fds), ctrl)
        if started is None:
            return request, list(fds)  # in the worker
        for fd in fds:
            os.close(fd)
        _send(ctrl, started)


def _fork_worker(request, fds, ctrl):
    """Double fork: the worker's parent exits at once, so the worker is reparented to the agent
    (a child subreaper), which waits for it as for a cold one. Returns the answer for the agent,
    or None in the worker."""
    read_end, write_end = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    middle = os.fork()
    if middle == 0:
        try:
            os.close(read_end)
            # Our own pid, taken before the fork: the worker's getppid() may already be the
            # agent's by the time it looks, if we have exited.
            request["_middle"] = os.getpid()
            request["_report"] = write_end
            if os.fork() == 0:
                return None
        except BaseException:
            pass
        os._exit(0)
    os.close(write_end)
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
        return {"pid": int(text[3:])}
    return {"error": text[4:] if text.startswith("err ") else "the forked worker ended before it started"}


def _become_worker(request, fds, ctrl):
    """In the worker: everything a cold start gives, in the order a cold start has it."""
    report = request["_report"]
    step = "setup"

    def fail(why):
        try:
            os.write(report, ("err " + why).encode())
        finally:
            os._exit(127)

    try:
        # Our own process group, as a cold worker has (a stop reaches everything in it).
        step = "process group"
        os.setpgid(0, 0)
        # Registered with the guardian before any user code runs (runner/io/guardian.h).
        guardian = fds[3] if len(fds) > 3 else -1
        if guardian >= 0:
            os.write(guardian, struct.pack("@ci", b"+", os.getpid()))
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
        os.dup2(fds[0], 0)
        os.dup2(fds[1], 1)
        os.dup2(fds[2], 2)
        step = "folder"
        os.chdir(request["cwd"])
        if request.get("nofile"):
            import resource
            resource.setrlimit(resource.RLIMIT_NOFILE, tuple(request["nofile"]))
        # Signals as the interpreter sets them at start; the template changed none but SIGCHLD.
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, [])
        # Nothing of the template's crosses but stdio: the control socket, the descriptors
        # received, the report pipe (closed below, once we report).
        sock_fd = ctrl.detach()
        os.close(sock_fd)
        for fd in fds:
            if fd > 2:
                try:
                    os.close(fd)
                except OSError:
                    pass
        for name in os.listdir("/proc/self/fd"):
            fd = int(name)
            if fd > 2 and fd != report:
                try:
                    os.close(fd)
                except OSError:
                    pass  # the listing's own descriptor
        # The environment, wholesale: what the cold worker's exec would have given.
        step = "environment"
        os.environ.clear()
        os.environ.update(request["env"])
        sys.argv = list(request["argv"])
        sys.orig_argv = list(request.get("orig_argv", sys.argv))
        _fresh_seeds()
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
    began = time.monotonic()
    try:
        import importlib
        for name in config["preload"]:
            importlib.import_module(name)
    except BaseException as error:
        _send(ctrl, {"ready": False, "reason": "cannot import the preloaded modules: %s: %s"
                                               % (type(error).__name__, error)})
        os._exit(1)
    import_s = time.monotonic() - began
    why = _refusal(control_fd)
    if why is not None:
        _send(ctrl, {"ready": False, "reason": why})
        os._exit(1)
    # Forked children that exit are reaped by waitpid in _fork_worker; nothing else forks here.
    _send(ctrl, {"ready": True, "import_s": import_s})
    return config, ctrl


if __name__ == "__main__":
    _config, _ctrl = _start_template()
    _request, _fds = _serve(_config, _ctrl)
    # In the worker from here on; the template's names above stay in this module's globals,
    # which the worker's __main__ (a new module) does not see.
    _become_worker(_request, _fds, _ctrl)
    del _request, _fds, _ctrl
    try:
        _run_main(_config)
    except SystemExit:
        raise
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
        sys.exit(1)
