"""The warm-start template (worker/warm/template.py) through its own protocol, with this process
standing in for the agent (a child subreaper, as the agent is): a request's workers forked
together, `go` withheld, module state from the environment (the stand-ins of
tests/e2e/warm_standins) set again or refused, and how a failing worker exits.

Usage: test_warm_template.py TEMPLATE_PY [unittest options]. Needs no torch.
"""

import array
import ctypes
import json
import os
import signal
import socket
import sys
import tempfile
import textwrap
import time
import unittest

TEMPLATE = None  # set from argv
STANDINS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "e2e", "warm_standins")
PR_SET_CHILD_SUBREAPER = 36

# What every worker of these tests writes: its rank as the environment says and as the module
# state the stand-ins kept says, and the variables the imports touch.
PROBE = textwrap.dedent("""
    import atexit, json, os, sys
    state = {"rank": os.environ["RANK"], "pid": os.getpid(), "ppid": os.getppid(),
             "nvml": os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK"),
             "set": os.environ.get("STANDIN_SET"), "removed": os.environ.get("STANDIN_REMOVED")}
    for name, attr in (("lightning.fabric.utilities.rank_zero", "rank_zero_only"),
                       ("torchmetrics.utilities.prints", "rank_zero_only")):
        module = sys.modules.get(name)
        if module is not None:
            state[name] = getattr(module, attr).rank
    for name, attr in (("reads_rank", "RANK_AT_IMPORT"), ("walks_names", "NAMES")):
        module = sys.modules.get(name)
        if module is not None:
            state[name] = getattr(module, attr)
    out = os.path.join(os.environ["OUT"], "rank-%s.json" % os.environ["RANK"])
    with open(out, "w") as f:
        json.dump(state, f)
    if os.environ.get("FAIL") == os.environ["RANK"]:
        class Finalized:
            # Its names are bound now: at an interpreter's teardown the builtins may be gone.
            def __del__(self, _open=open, _path=os.path.join(os.environ["OUT"], "finalized")):
                with _open(_path, "w") as f:
                    f.write("yes")
        keep = Finalized()
        atexit.register(lambda: open(os.path.join(os.environ["OUT"], "atexit"), "w").write("yes"))
        raise ValueError("fails on purpose")
""")


class Template(object):
    """template.py started as the agent starts it: its socket on descriptor 3."""

    def __init__(self, folder, preload, env):
        self.folder = folder
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.log = open(os.path.join(folder, "template.log"), "w+")
        pid = os.fork()
        if pid == 0:
            try:
                os.chdir(folder)
                os.dup2(theirs.fileno(), 3)
                os.dup2(self.log.fileno(), 1)
                os.dup2(self.log.fileno(), 2)
                os.closerange(4, 1024)
                os.execve(sys.executable, [sys.executable, TEMPLATE], env)
            finally:
                os._exit(127)
        theirs.close()
        self.pid = pid
        self.sock = ours
        self.env = env
        ours.send(json.dumps({"module": False, "target": "probe.py", "preload": preload}).encode())
        self.ready = json.loads(self.recv(60))

    def recv(self, timeout):
        self.sock.settimeout(timeout)
        return self.sock.recv(1 << 20)

    def fork(self, workers):
        """Sends one request; `workers` are environments. Returns [(answer, stdout, go)]."""
        self.requests = getattr(self, "requests", 0) + 1
        message = {"id": self.requests, "agent": os.getpid(), "guardian": False, "workers": []}
        fds, keep = [], []
        for env in workers:
            message["workers"].append({"argv": ["probe.py"], "orig_argv": [sys.executable, "probe.py"],
                                       "env": env, "cwd": self.folder, "nofile": None})
            out = os.open(os.path.join(self.folder, "out-%s.txt" % env["RANK"]), os.O_WRONLY | os.O_CREAT, 0o644)
            go_read, go_write = os.pipe()
            fds += [out, out, go_read]
            keep.append((out, go_read, go_write))
        self.sock.sendmsg([json.dumps(message).encode()],
                          [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
        answer = json.loads(self.recv(60))
        assert answer["id"] == self.requests, answer
        for out, go_read, _ in keep:
            os.close(out)
            os.close(go_read)
        return [(entry, go_write) for entry, (_, _, go_write) in zip(answer["started"], keep)]

    def close(self):
        self.sock.close()
        os.waitpid(self.pid, 0)
        self.log.close()


def worker_env(folder, rank, extra=None):
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": STANDINS, "RANK": str(rank), "LOCAL_RANK": str(rank),
           "OUT": folder, "STANDIN_REMOVED": "x"}
    env.update(extra or {})
    return env


def wait_exit(pid, limit=30.0):
    """Waits for our child `pid` (a worker reparented to us); returns its exit code."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    raise AssertionError("worker %d did not exit" % pid)


class WarmTemplateTest(unittest.TestCase):

    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.folder = self.dir.name
        with open(os.path.join(self.folder, "probe.py"), "w") as f:
            f.write(PROBE)
        self.templates = []

    def tearDown(self):
        for template in self.templates:
            template.close()
        self.dir.cleanup()

    def start(self, preload, rank0_extra=None):
        template = Template(self.folder, preload, worker_env(self.folder, 0, rank0_extra))
        self.templates.append(template)
        self.assertTrue(template.ready.get("ready"), template.ready)
        return template

    def state(self, rank):
        with open(os.path.join(self.folder, "rank-%d.json" % rank)) as f:
            return json.load(f)

    def run_all(self, template, envs):
        answers = template.fork(envs)
        pids = []
        for (answer, go), env in zip(answers, envs):
            if "pid" in answer:
                os.write(go, b"g")
                pids.append(answer["pid"])
            os.close(go)
        return answers, [wait_exit(pid) for pid in pids]

    def test_a_request_forks_all_its_workers_and_they_are_reparented_here(self):
        template = self.start(["json"])
        answers, codes = self.run_all(template, [worker_env(self.folder, r) for r in range(4)])
        self.assertEqual([sorted(a) for a, _ in answers], [["pid"]] * 4, answers)
        self.assertEqual(codes, [0] * 4)
        for rank in range(4):
            state = self.state(rank)
            self.assertEqual(state["rank"], str(rank))
            self.assertEqual(state["ppid"], os.getpid())  # the agent's child, as a cold worker

    def test_a_worker_whose_go_is_closed_unwritten_runs_no_job_code(self):
        template = self.start(["json"])
        answers = template.fork([worker_env(self.folder, 0), worker_env(self.folder, 1)])
        pids = [a["pid"] for a, _ in answers]
        os.write(answers[0][1], b"g")
        for _, go in answers:
            os.close(go)
        self.assertEqual(wait_exit(pids[0]), 0)
        self.assertEqual(wait_exit(pids[1]), 137)
        self.assertTrue(os.path.exists(os.path.join(self.folder, "rank-0.json")))
        self.assertFalse(os.path.exists(os.path.join(self.folder, "rank-1.json")))

    def test_lightning_rank_state_and_its_environment_are_each_workers_own(self):
        template = self.start(["lightning.fabric.utilities.rank_zero", "torchmetrics.utilities.prints", "sets_var"])
        envs = [worker_env(self.folder, r, {"LOCAL_RANK": str(r % 2)}) for r in range(4)]
        answers, codes = self.run_all(template, envs)
        self.assertEqual([sorted(a) for a, _ in answers], [["pid"]] * 4, answers)
        self.assertEqual(codes, [0] * 4)
        for rank in range(4):
            state = self.state(rank)
            self.assertEqual(state["lightning.fabric.utilities.rank_zero"], rank)
            self.assertEqual(state["torchmetrics.utilities.prints"], rank % 2)
            self.assertEqual(state["nvml"], "1")   # set by the stand-in's import, as Lightning's
            self.assertEqual(state["set"], "1")
            self.assertIsNone(state["removed"])
        with open(os.path.join(self.folder, "template.log")) as f:
            log = f.read()
        self.assertIn("the imports read RANK: lightning.fabric.utilities.rank_zero (set again in each worker)", log)
        self.assertIn("the imports set PYTORCH_NVML_BASED_CUDA_CHECK (lightning.fabric)", log)

    def test_a_module_that_kept_a_rank_specific_variable_makes_other_ranks_start_cold(self):
        template = self.start(["reads_rank"])
        answers, codes = self.run_all(template, [worker_env(self.folder, r) for r in range(2)])
        self.assertIn("pid", answers[0][0])   # rank 0's RANK is the template's
        self.assertEqual(answers[1][0], {"cold": "reads_rank read RANK when the template imported it, and this "
                                                 "worker's RANK differs ('1', the template's '0'): a fork would "
                                                 "keep the template's"})
        self.assertEqual(self.state(0)["reads_rank"], "0")

    def test_a_module_that_walked_the_names_refuses_a_worker_with_other_names(self):
        template = self.start(["walks_names"], {"STANDIN_A": "1"})
        same = worker_env(self.folder, 1, {"STANDIN_A": "other value"})
        more = worker_env(self.folder, 2, {"STANDIN_A": "1", "STANDIN_B": "1"})
        answers, _ = self.run_all(template, [same, more])
        self.assertIn("pid", answers[0][0])   # the same names: what the walk found is the same
        self.assertEqual(self.state(1)["walks_names"], ["STANDIN_A", "STANDIN_REMOVED"])
        self.assertIn("cold", answers[1][0])
        self.assertIn("walks_names walked the environment's names when the template imported it, and this "
                      "worker has other names (STANDIN_B)", answers[1][0]["cold"])

    def test_a_failing_worker_runs_its_exit_handlers_and_leaves_at_once(self):
        template = self.start(["json"])
        answers, codes = self.run_all(template, [worker_env(self.folder, 0, {"FAIL": "0"})])
        self.assertEqual(codes, [1])
        with open(os.path.join(self.folder, "out-0.txt")) as f:
            self.assertIn("ValueError: fails on purpose", f.read())
        self.assertTrue(os.path.exists(os.path.join(self.folder, "atexit")))
        # The teardown is skipped: a finalizer of an object still alive does not run.
        self.assertFalse(os.path.exists(os.path.join(self.folder, "finalized")))

    def test_the_full_teardown_when_the_job_asks_for_it(self):
        template = self.start(["json"])
        answers, codes = self.run_all(template, [worker_env(self.folder, 0, {"FAIL": "0",
                                                                             "DDPRUN_WARM_FAST_EXIT": "0"})])
        self.assertEqual(codes, [1])
        self.assertTrue(os.path.exists(os.path.join(self.folder, "atexit")))
        self.assertTrue(os.path.exists(os.path.join(self.folder, "finalized")))


if __name__ == "__main__":
    TEMPLATE = os.path.abspath(sys.argv.pop(1))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise SystemExit("cannot become a child subreaper")
    unittest.main()
