"""A worker that writes down what it sees of its own start (tests/e2e/warm_test.cc compares a
warm start with a cold one): argv, sys.path, __main__, environment, process group, descriptors,
signals, seeds. Rank 1 of attempt 0 then fails, so that the error file and the traceback can be
compared too. Usage: warm_probe.py OUT_DIR."""
_MAIN_NAMES = sorted(globals())

import json
import os
import random
import resource
import signal
import sys
import time

import torch
from torch.distributed.elastic.multiprocessing.errors import record


def descriptors():
    found = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink("/proc/self/fd/" + name)
        except OSError:
            continue  # the listing's own descriptor
        found[name] = "pipe" if target.startswith("pipe:") else target
    return found


@record
def main():
    rank = int(os.environ["RANK"])
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    ddprun_before = "ddprun" in sys.modules
    import ddprun
    seen = {
        "argv": sys.argv,
        "orig_argv": getattr(sys, "orig_argv", None),
        "path": sys.path,
        "main_names": _MAIN_NAMES,
        "file": __file__,
        "name": __name__,
        "spec": repr(__spec__),
        "package": __package__,
        "loader": type(__loader__).__name__,
        "builtins": type(__builtins__).__name__,
        "cwd": os.getcwd(),
        "env": dict(os.environ),
        "own_group": os.getpgid(0) == os.getpid(),
        "session_of_parent": os.getsid(0) == os.getsid(os.getppid()),
        "ppid": os.getppid(),
        "threads": len(os.listdir("/proc/self/task")),
        "fds": descriptors(),
        "signals": {str(int(s)): str(signal.getsignal(s)) for s in
                    (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD, signal.SIGPIPE, signal.SIGUSR1, signal.SIGUSR2)},
        "blocked": sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])),
        "flags": str(sys.flags),
        "nofile": list(resource.getrlimit(resource.RLIMIT_NOFILE)),
        "stdout": [sys.stdout.line_buffering, sys.stdout.write_through],
        "ddprun_before_import": ddprun_before,
        "stack_dump_registered": ddprun._sender is not None and ddprun._sender.stack_signal != 0,
        "random": random.random(),
        "torch_seed": torch.initial_seed(),
    }
    path = os.path.join(sys.argv[1], "probe-%d-%d.json" % (rank, attempt))
    with open(path + ".tmp", "w") as f:
        json.dump(seen, f, sort_keys=True)
    os.replace(path + ".tmp", path)
    print("probe rank %d attempt %d" % (rank, attempt), flush=True)
    if rank == 1 and attempt == 0:
        # Rank 0 must have written its probe before this failure stops it.
        while not os.path.exists(os.path.join(sys.argv[1], "probe-0-0.json")):
            time.sleep(0.02)
        raise ValueError("warm probe fails on purpose")


if __name__ == "__main__":
    main()
