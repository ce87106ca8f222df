"""worker/c/ddprun_progress.h: the datagrams a program that includes it sends, and none without
ddprun's environment. Usage: test_c_header.py <program built from beacon_program.c>."""

import os
import socket
import subprocess
import sys
import unittest

TOKEN = "fedcba9876543210fedcba9876543210"
PROGRAM = None


class CHeaderTest(unittest.TestCase):
    def setUp(self):
        self.receiver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.receiver.bind(("127.0.0.1", 0))
        self.address = "127.0.0.1:%d" % self.receiver.getsockname()[1]

    def tearDown(self):
        self.receiver.close()

    def run_program(self, **env_vars):
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("DDPRUN_") and k not in ("TORCHELASTIC_RESTART_COUNT",
                                                             "LOCAL_RANK")}
        env.update(env_vars)
        done = subprocess.run([PROGRAM], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              timeout=60)
        self.assertEqual((done.returncode, done.stdout, done.stderr), (0, b"", b""))
        self.receiver.setblocking(False)
        got = []
        while True:
            try:
                got.append(self.receiver.recv(4096).decode("ascii"))
            except BlockingIOError:
                return got

    def test_sends_the_step_with_unknown_busy_time_and_no_stack_signal(self):
        got = self.run_program(DDPRUN_PROGRESS_ADDR=self.address, DDPRUN_PROGRESS_TOKEN=TOKEN,
                               TORCHELASTIC_RESTART_COUNT="4", LOCAL_RANK="1")
        self.assertEqual(got, [
            "ddprun1 %s 4 1 step 7 -1 0" % TOKEN,
            "ddprun1 %s 4 1 step 9 -1 0" % TOKEN,
        ])

    def test_sends_nothing_without_or_with_a_malformed_environment(self):
        good = {"DDPRUN_PROGRESS_ADDR": self.address, "DDPRUN_PROGRESS_TOKEN": TOKEN,
                "TORCHELASTIC_RESTART_COUNT": "0", "LOCAL_RANK": "0"}
        port = self.address.split(":")[1]
        cases = [
            {"DDPRUN_PROGRESS_ADDR": None},
            {"DDPRUN_PROGRESS_ADDR": "127.0.0.1"},
            {"DDPRUN_PROGRESS_ADDR": "127.0.0.1:0"},
            {"DDPRUN_PROGRESS_ADDR": "127.0.0.1:65536"},
            {"DDPRUN_PROGRESS_ADDR": "127.0.0.1:%sx" % port},
            {"DDPRUN_PROGRESS_ADDR": "localhost:" + port},
            {"DDPRUN_PROGRESS_ADDR": "1234567890.0.0.1:" + port},
            {"DDPRUN_PROGRESS_TOKEN": None},
            {"DDPRUN_PROGRESS_TOKEN": "not hex"},
            {"DDPRUN_PROGRESS_TOKEN": "a" * 65},
            {"TORCHELASTIC_RESTART_COUNT": "-1"},
            {"LOCAL_RANK": None},
        ]
        for case in cases:
            with self.subTest(case=case):
                env = dict(good)
                env.update(case)
                self.assertEqual(self.run_program(**{k: v for k, v in env.items() if v is not None}),
                                 [])

    def test_an_unreachable_port_does_not_fail_the_program(self):
        closed = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        closed.bind(("127.0.0.1", 0))
        address = "127.0.0.1:%d" % closed.getsockname()[1]
        closed.close()
        self.assertEqual(self.run_program(DDPRUN_PROGRESS_ADDR=address, DDPRUN_PROGRESS_TOKEN=TOKEN,
                                          TORCHELASTIC_RESTART_COUNT="0", LOCAL_RANK="0"), [])


if __name__ == "__main__":
    PROGRAM = sys.argv.pop(1)
    unittest.main()
