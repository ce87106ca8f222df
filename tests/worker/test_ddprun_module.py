"""The ddprun worker module: datagrams, throttling, bad environments, forks, stack dumps, Lightning.

Each case runs a small script in a fresh interpreter (the module acts at import) against a UDP
socket bound here. PYTHONPATH must name the staged copy (ctest sets it).
"""

import os
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import unittest

TOKEN = "0123456789abcdef0123456789abcdef"
USR2 = int(signal.SIGUSR2)

# Counts this process's sockets; printed by the scripts that must open none.
COUNT_SOCKETS = textwrap.dedent("""
    def count_sockets():
        n = 0
        for fd in os.listdir("/proc/self/fd"):
            try:
                n += os.readlink("/proc/self/fd/" + fd).startswith("socket:")
            except OSError:
                pass
        return n
""")


class Receiver(object):
    """A UDP socket on 127.0.0.1 that stands in for the agent."""

    def __init__(self):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.address = "127.0.0.1:%d" % self.sock.getsockname()[1]

    def close(self):
        self.sock.close()

    def datagrams(self):
        """Everything received so far (loopback delivers at send, so a finished script's all)."""
        self.sock.setblocking(False)
        got = []
        while True:
            try:
                got.append(self.sock.recv(4096).decode("ascii"))
            except BlockingIOError:
                return got


def worker_env(address, **extra):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("DDPRUN_") and k not in ("TORCHELASTIC_RESTART_COUNT", "LOCAL_RANK")}
    env.update({"DDPRUN_PROGRESS_TOKEN": TOKEN, "TORCHELASTIC_RESTART_COUNT": "3",
                "LOCAL_RANK": "2"})
    if address is not None:
        env["DDPRUN_PROGRESS_ADDR"] = address
    env.update(extra)
    return env


def run_script(test, script, env):
    """Runs `script` (a string, or a tuple of strings each indented its own way) in a fresh
    interpreter; asserts it exits 0 with nothing on stderr and returns its stdout."""
    pieces = script if isinstance(script, tuple) else (script,)
    code = "\n".join(textwrap.dedent(piece) for piece in pieces)
    done = subprocess.run([sys.executable, "-c", code], env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60,
                          universal_newlines=True)
    test.assertEqual(done.returncode, 0, "script failed:\n" + done.stderr)
    test.assertEqual(done.stderr, "")
    return done.stdout


def beacon(kind, step, busy_us, stack_signal=0, round_=3, local_rank=2):
    return "ddprun1 %s %d %d %s %d %d %d" % (TOKEN, round_, local_rank, kind, step, busy_us,
                                             stack_signal)


class ModuleTest(unittest.TestCase):
    def setUp(self):
        self.receiver = Receiver()
        self.tmp = tempfile.TemporaryDirectory()
        self.stacks = os.path.join(self.tmp.name, "rank-5.stacks")

    def tearDown(self):
        self.receiver.close()
        self.tmp.cleanup()

    def test_without_the_address_nothing_is_sent_and_no_socket_is_opened(self):
        out = run_script(self, (COUNT_SOCKETS, """
            import os
            import ddprun
            for step in range(5):
                ddprun.progress(step, busy=0.1)
                ddprun.progress()
            ddprun.phase("checkpoint")
            print(count_sockets())
        """), worker_env(None, DDPRUN_STACKS_FILE=self.stacks))
        self.assertEqual(out, "0\n")
        self.assertEqual(self.receiver.datagrams(), [])
        self.assertFalse(os.path.exists(self.stacks))

    def test_hello_step_and_phase_datagrams_are_exact(self):
        run_script(self, """
            import ddprun
            ddprun.progress(42, busy=0.25)
            ddprun.phase("checkpoint")
        """, worker_env(self.receiver.address))
        self.assertEqual(self.receiver.datagrams(), [
            beacon("hello", 0, -1),
            beacon("step", 42, 250000),
            beacon("phase", 42, -1),
        ])

    def test_a_step_without_a_number_counts_the_calls(self):
        run_script(self, """
            import time
            import ddprun
            ddprun.progress()
            time.sleep(0.15)
            ddprun.progress(busy=0.002)
            time.sleep(0.15)
            ddprun.progress()
        """, worker_env(self.receiver.address))
        self.assertEqual(self.receiver.datagrams(), [
            beacon("hello", 0, -1),
            beacon("step", 1, -1),
            beacon("step", 2, 2000),
            beacon("step", 3, -1),
        ])

    def test_many_calls_in_a_tenth_of_a_second_send_one_and_the_newest_when_it_is_over(self):
        out = run_script(self, """
            import time
            import ddprun
            start = time.monotonic()
            for _ in range(1000):
                ddprun.progress(busy=0.001)
            print("%.3f" % (time.monotonic() - start))
            time.sleep(0.15)
            ddprun.progress(busy=0.001)
            time.sleep(0.3)
        """, worker_env(self.receiver.address))
        self.assertLess(float(out), 0.1, "the loop must run within one throttle interval")
        # The newest step goes out when the interval is over, though no call follows (a rank
        # that hangs after it is named at its real last step), with the held-back busy time.
        self.assertEqual(self.receiver.datagrams(), [
            beacon("hello", 0, -1),
            beacon("step", 1, 1000),
            beacon("step", 1000, 999000),
            beacon("step", 1001, 1000),
        ])

    def test_a_phase_sends_the_step_held_back_first_and_is_never_throttled(self):
        run_script(self, """
            import time
            import ddprun
            ddprun.progress(5)
            ddprun.progress(6)
            ddprun.phase("checkpoint")
            ddprun.phase("evaluation")
            time.sleep(0.15)
            ddprun.progress(8)
        """, worker_env(self.receiver.address))
        self.assertEqual(self.receiver.datagrams(), [
            beacon("hello", 0, -1),
            beacon("step", 5, -1),
            beacon("step", 6, -1),
            beacon("phase", 6, -1),
            beacon("phase", 6, -1),
            beacon("step", 8, -1),
        ])

    def test_a_bad_step_or_busy_time_never_raises(self):
        run_script(self, """
            import time
            import ddprun
            for step in (-1, 1.5, "7", True, 2 ** 63, object()):
                ddprun.progress(step)
            ddprun.progress(3, busy=float("nan"))
            time.sleep(0.15)
            ddprun.progress(4, busy="soon")
            ddprun.phase()
        """, worker_env(self.receiver.address))
        self.assertEqual(self.receiver.datagrams(), [
            beacon("hello", 0, -1),
            beacon("step", 3, -1),
            beacon("step", 4, -1),
            beacon("phase", 4, -1),
        ])

    def test_a_malformed_environment_makes_every_call_a_no_op(self):
        port = self.receiver.address.split(":")[1]
        cases = [
            {"DDPRUN_PROGRESS_ADDR": ""},
            {"DDPRUN_PROGRESS_ADDR": "garbage"},
            {"DDPRUN_PROGRESS_ADDR": "127.0.0.1"},
            {"DDPRUN_PROGRESS_ADDR": "127.0.0.1:"},
            {"DDPRUN_PROGRESS_ADDR": ":" + port},
            {"DDPRUN_PROGRESS_ADDR": "127.0.0.1:0"},
            {"DDPRUN_PROGRESS_ADDR": "127.0.0.1:65536"},
            {"DDPRUN_PROGRESS_ADDR": "127.0.0.1:-1"},
            {"DDPRUN_PROGRESS_ADDR": "127.0.0.1:%sx" % port},
            {"DDPRUN_PROGRESS_ADDR": "localhost:" + port},  # a name would need a DNS lookup
            {"DDPRUN_PROGRESS_ADDR": "[::1]:" + port},
            {"DDPRUN_PROGRESS_TOKEN": ""},
            {"DDPRUN_PROGRESS_TOKEN": "not hex"},
            {"DDPRUN_PROGRESS_TOKEN": "a" * 65},
            {"TORCHELASTIC_RESTART_COUNT": "-1"},
            {"TORCHELASTIC_RESTART_COUNT": ""},
            {"LOCAL_RANK": "one"},
        ]
        for case in cases:
            with self.subTest(case=case):
                out = run_script(self, (COUNT_SOCKETS, """
                    import os
                    import ddprun
                    ddprun.progress(1)
                    ddprun.phase("checkpoint")
                    print(count_sockets())
                """), worker_env(self.receiver.address, **case))
                self.assertEqual(out, "0\n")
                self.assertEqual(self.receiver.datagrams(), [])

    def test_an_unreachable_port_never_raises(self):
        closed = Receiver()
        address = closed.address
        closed.close()
        out = run_script(self, """
            import time
            import ddprun
            for step in range(4):
                ddprun.progress(step)
                ddprun.phase("checkpoint")
                time.sleep(0.12)  # each send may now see ECONNREFUSED from the last one
            print("still training")
        """, worker_env(address))
        self.assertEqual(out, "still training\n")

    def test_a_forked_child_sends_nothing_and_has_no_stack_handler(self):
        out = run_script(self, """
            import ctypes
            import faulthandler
            import os
            import signal
            import ddprun
            pid = os.fork()
            if pid == 0:
                unregistered = faulthandler.unregister(signal.SIGUSR2)
                ddprun.progress(5)
                ddprun.phase("checkpoint")
                os.write(1, ("child handler %s\\n" % unregistered).encode())
                os._exit(0)
            os.waitpid(pid, 0)
            # A fork that runs no Python fork hooks (as from C code): the pid check stops it.
            pid = ctypes.CDLL(None, use_errno=True).fork()
            if pid == 0:
                ddprun.progress(6)
                ddprun.phase("checkpoint")
                os._exit(0)
            os.waitpid(pid, 0)
            ddprun.progress(7)
            print("parent handler %s" % faulthandler.unregister(signal.SIGUSR2))
        """, worker_env(self.receiver.address, DDPRUN_STACKS_FILE=self.stacks))
        self.assertEqual(out, "child handler False\nparent handler True\n")
        self.assertEqual(self.receiver.datagrams(), [
            beacon("hello", 0, -1, stack_signal=USR2),
            beacon("step", 7, -1, stack_signal=USR2),
        ])

    def test_sigusr2_dumps_every_thread_into_the_stacks_file_and_training_goes_on(self):
        script = textwrap.dedent("""
            import os
            import sys
            import threading
            import time
            import ddprun

            stop = threading.Event()

            def a_second_thread_waiting():
                stop.wait()

            helper = threading.Thread(target=a_second_thread_waiting)
            helper.start()

            def waiting_for_the_stack_dump():
                print("ready", flush=True)
                deadline = time.monotonic() + 30
                while os.path.getsize(os.environ["DDPRUN_STACKS_FILE"]) == 0:
                    if time.monotonic() > deadline:
                        sys.exit("no dump")
                    time.sleep(0.01)

            waiting_for_the_stack_dump()
            stop.set()
            helper.join()
            print("alive", flush=True)
        """)
        worker = subprocess.Popen(
            [sys.executable, "-c", script], universal_newlines=True, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=worker_env(self.receiver.address, DDPRUN_STACKS_FILE=self.stacks))
        try:
            self.assertEqual(worker.stdout.readline(), "ready\n")
            os.kill(worker.pid, signal.SIGUSR2)
            out, err = worker.communicate(timeout=60)
        finally:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
        self.assertEqual((worker.returncode, out, err), (0, "alive\n", ""))
        with open(self.stacks) as f:
            dump = f.read()
        self.assertIn("(most recent call first)", dump)
        self.assertIn("waiting_for_the_stack_dump", dump)
        self.assertIn("a_second_thread_waiting", dump)  # all threads
        self.assertEqual(self.receiver.datagrams(), [beacon("hello", 0, -1, stack_signal=USR2)])

    def test_a_sigusr2_handler_set_before_import_is_kept(self):
        out = run_script(self, """
            import os
            import signal
            import time
            handled = []
            signal.signal(signal.SIGUSR2, lambda signum, frame: handled.append(signum))
            import ddprun
            os.kill(os.getpid(), signal.SIGUSR2)
            for _ in range(500):
                if handled:
                    break
                time.sleep(0.01)
            print("handled %d" % len(handled))
        """, worker_env(self.receiver.address, DDPRUN_STACKS_FILE=self.stacks))
        self.assertEqual(out, "handled 1\n")
        self.assertFalse(os.path.exists(self.stacks))
        self.assertEqual(self.receiver.datagrams(), [beacon("hello", 0, -1, stack_signal=0)])

    def test_an_ignored_sigusr2_stays_ignored(self):
        out = run_script(self, """
            import signal
            signal.signal(signal.SIGUSR2, signal.SIG_IGN)
            import ddprun
            print(signal.getsignal(signal.SIGUSR2) is signal.SIG_IGN)
        """, worker_env(self.receiver.address, DDPRUN_STACKS_FILE=self.stacks))
        self.assertEqual(out, "True\n")
        self.assertEqual(self.receiver.datagrams(), [beacon("hello", 0, -1, stack_signal=0)])


class LightningCallbackTest(unittest.TestCase):
    def setUp(self):
        self.receiver = Receiver()

    def tearDown(self):
        self.receiver.close()

    def test_hooks_send_steps_with_busy_time_and_phases(self):
        out = run_script(self, """
            import time
            import ddprun
            from ddprun.lightning import ProgressCallback

            class Trainer(object):
                global_step = 0

            trainer = Trainer()
            callback = ProgressCallback()
            print(ProgressCallback.__mro__[-1] is object, len(ProgressCallback.__mro__))

            def batch(index, forward_s, backward_s):
                callback.on_train_batch_start(trainer, None, "batch", index)
                time.sleep(forward_s)
                callback.on_before_backward(trainer, None, "loss")
                time.sleep(backward_s)  # DDP waits for the other ranks here: not busy
                callback.on_after_backward(trainer, None)
                trainer.global_step += 1
                callback.on_train_batch_end(trainer, None, {}, "batch", index)

            callback.setup(trainer, None, "fit")
            callback.on_train_epoch_start(trainer, None)
            batch(0, forward_s=0.05, backward_s=0.3)
            time.sleep(0.15)  # loading the next batch: busy
            batch(1, forward_s=0.02, backward_s=0.3)
            time.sleep(0.15)
            callback.on_validation_batch_end(trainer, None, {}, "batch", 0)
            time.sleep(0.3)  # the rest of validation is not loading the next batch
            batch(2, forward_s=0.01, backward_s=0.0)
            callback.on_save_checkpoint(trainer, None, {})
            time.sleep(0.3)  # nor is the rest of saving the checkpoint
            batch(3, forward_s=0.01, backward_s=0.0)
            callback.on_load_checkpoint(trainer, None, {})
        """, worker_env(self.receiver.address))
        # No Lightning here: a plain class (itself, the hooks, object).
        self.assertEqual(out, "True 3\n")
        got = [d.split(" ") for d in self.receiver.datagrams()]
        self.assertEqual([(g[4], g[5]) for g in got], [
            ("hello", "0"), ("phase", "0"), ("step", "1"), ("step", "2"), ("step", "2"),
            ("step", "3"), ("phase", "3"), ("step", "4"), ("phase", "4")])
        busy_us = [int(g[6]) for g in got]
        self.assertEqual([busy_us[i] for i in (0, 1, 4, 6, 8)], [-1, -1, -1, -1, -1])
        self.assertGreaterEqual(busy_us[2], 50000)   # the forward pass
        self.assertLess(busy_us[2], 300000)          # not the backward pass
        self.assertGreaterEqual(busy_us[3], 170000)  # loading the batch and the forward pass
        self.assertLess(busy_us[3], 450000)
        self.assertGreaterEqual(busy_us[5], 10000)
        self.assertLess(busy_us[5], 300000)          # not the validation before it
        self.assertGreaterEqual(busy_us[7], 10000)
        self.assertLess(busy_us[7], 300000)          # not the checkpoint before it

    def test_the_readmes_form_reaches_the_callback_without_a_second_import(self):
        # Issue 40: `import ddprun` then `ddprun.lightning.ProgressCallback()` raised
        # AttributeError: the submodule was never imported. `import ddprun` alone still imports
        # no Lightning.
        out = run_script(self, ("""
            import sys
            import types
            module = types.ModuleType("lightning.pytorch")
            class Callback(object):
                pass
            module.Callback = Callback
            sys.modules["lightning.pytorch"] = module
            import ddprun
            print("ddprun.lightning" in sys.modules)
            callback = ddprun.lightning.ProgressCallback()
            print(isinstance(callback, Callback), "ddprun.lightning" in sys.modules)
            try:
                ddprun.no_such_thing
            except AttributeError as error:
                print("AttributeError", error)
        """,), worker_env(self.receiver.address))
        self.assertEqual(out, "False\nTrue True\nAttributeError module 'ddprun' has no attribute 'no_such_thing'\n")

    def test_the_callback_subclasses_each_installed_lightning_callback(self):
        fake_packages = """
            import sys
            import types

            def fake_package(name):
                module = types.ModuleType(name)
                class Callback(object):
                    def on_train_batch_end(self, *args):
                        raise AssertionError("the base class's hook ran")
                module.Callback = Callback
                sys.modules[name] = module
                return Callback
        """
        cases = [
            ('new = fake_package("lightning.pytorch"); old = fake_package("pytorch_lightning")',
             "True True\n"),
            ('new = fake_package("lightning.pytorch"); old = None', "True False\n"),
            ('new = None; old = fake_package("pytorch_lightning")', "False True\n"),
        ]
        for packages, expected in cases:
            with self.subTest(packages=packages):
                out = run_script(self, (fake_packages, packages, """
                    from ddprun.lightning import ProgressCallback

                    class Trainer(object):
                        global_step = 4

                    callback = ProgressCallback()
                    callback.on_train_batch_end(Trainer(), None, {}, "batch", 0)
                    print(new is not None and isinstance(callback, new),
                          old is not None and isinstance(callback, old))
                """), worker_env(self.receiver.address))
                self.assertEqual(out, expected)
                self.assertEqual(self.receiver.datagrams(),
                                 [beacon("hello", 0, -1), beacon("step", 4, -1)])


if __name__ == "__main__":
    unittest.main()
