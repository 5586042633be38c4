#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""scripts/demo and .ci/run, run for real in a copy of the scripts over stand-ins for what they start.

No build, no daemon, no Debian root: the copy's build/ holds a stand-in tierd (a Python script that
serves its socket until SIGTERM), train-step, tierctl and train_lm.py, and PATH stand-ins for meson,
ninja and dpkg-query.  The stand-in train-step can be held (DEMO_HOLD: it says "ready" through a FIFO,
then waits for "go" on another), so that what happens while a demo runs comes in an explicit order.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import unittest

import tierd


FAKE_TIERD = """#!/usr/bin/python3
import os, signal, socket, sys
sock = sys.argv[sys.argv.index("--socket") + 1]
with open(os.path.join(os.path.dirname(sock), "..", "tierd-pids"), "a") as f:
    f.write(f"{os.getpid()}\\n")
s = socket.socket(socket.AF_UNIX)
s.bind(sock)
s.listen()
def stop(*_):
    os.unlink(sock)
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
print("tierd[info]: ready [VRAM IS EMULATED]", flush=True)
while True:
    signal.pause()
"""

# Held: "ready" into $DEMO_HOLD/ready, then wait for a line on $DEMO_HOLD/go.  Its descriptors other
# than 0-2 are closed first: what it inherits from the demo stays with the demo alone.
FAKE_TRAIN_STEP = """#!/usr/bin/python3
import os
os.closerange(3, 1 << 16)
hold = os.environ.get("DEMO_HOLD")
if hold:
    with open(os.path.join(hold, "ready"), "w") as f:
        f.write("ready\\n")
    with open(os.path.join(hold, "go")) as f:
        f.readline()
print("train-step: done")
"""


def write_exe(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, 0o755)


def pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


class Tree:
    """A temporary checkout holding copies of some of the scripts (the rest: stand-ins)."""

    def __init__(self, case: unittest.TestCase, *scripts: str) -> None:
        self.dir = tempfile.mkdtemp(prefix="tier-scripts.", dir="/var/tmp")
        case.addCleanup(shutil.rmtree, self.dir, True)
        for s in scripts:
            os.makedirs(os.path.dirname(self.path(s)), exist_ok=True)
            shutil.copy2(os.path.join(tierd.source_dir(), s), self.path(s))
        self.bin = self.path("bin")
        write_exe(os.path.join(self.bin, "meson"), "#!/bin/sh\nexit 0\n")
        write_exe(os.path.join(self.bin, "ninja"), "#!/bin/sh\nexit 0\n")
        write_exe(os.path.join(self.bin, "dpkg-query"), "#!/bin/sh\nprintf 'install ok installed'\n")
        # (without the ASan pass's preload: bash, flock and the rest are not ours)
        self.env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "ASAN_OPTIONS")}
        self.env["PATH"] = f"{self.bin}:/usr/sbin:/usr/bin:/sbin:/bin"

    def path(self, *p: str) -> str:
        return os.path.join(self.dir, *p)


class TestDemo(unittest.TestCase):
    def setUp(self) -> None:
        if os.geteuid() != 0:
            self.skipTest("scripts/demo runs as root only")
        self.t = Tree(self, "scripts/demo", "scripts/lib.sh")
        if shutil.disk_usage(self.t.dir).free < (2 << 30) + (64 << 20):
            self.skipTest(f"scripts/demo wants 2 GiB free for run/nvme0.img, {self.t.dir} has less")
        write_exe(self.t.path("build", "daemon", "tierd"), FAKE_TIERD)
        write_exe(self.t.path("build", "client", "train-step"), FAKE_TRAIN_STEP)
        write_exe(self.t.path("build", "client", "tierctl"), "#!/bin/sh\necho 'tierctl: status'\n")
        write_exe(self.t.path("client", "python", "examples", "train_lm.py"), "print('train_lm: done')\n")
        self.hold = self.t.path("hold")
        os.mkdir(self.hold)
        os.mkfifo(os.path.join(self.hold, "ready"))
        os.mkfifo(os.path.join(self.hold, "go"))
        self.procs: list[subprocess.Popen[str]] = []
        self.addCleanup(self.stop_all)

    def stop_all(self) -> None:
        """Whatever a failed test left: a held train-step let go, demos and stand-in tierds killed."""
        fd = os.open(os.path.join(self.hold, "go"), os.O_RDWR | os.O_NONBLOCK)  # a FIFO: O_RDWR never blocks
        os.write(fd, b"go\n" * 8)
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.communicate()
        for pid in self.tierd_pids():
            if pid_alive(pid):
                os.kill(pid, signal.SIGKILL)
        os.close(fd)

    def tierd_pids(self) -> list[int]:
        try:
            with open(self.t.path("tierd-pids")) as f:
                return [int(line) for line in f]
        except FileNotFoundError:
            return []

    def start(self, hold: bool) -> subprocess.Popen[str]:
        env = dict(self.t.env, DEMO_HOLD=self.hold) if hold else self.t.env
        p = subprocess.Popen([self.t.path("scripts", "demo"), "--no-install"], env=env, cwd="/",
                             stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, start_new_session=True)
        self.procs.append(p)
        if hold:
            with open(os.path.join(self.hold, "ready")) as f:   # until its train-step runs
                self.assertEqual(f.readline(), "ready\n")
        return p

    def let_go(self) -> None:
        with open(os.path.join(self.hold, "go"), "w") as f:
            f.write("go\n")

    def run_demo(self) -> subprocess.CompletedProcess[str]:
        return subprocess.run([self.t.path("scripts", "demo"), "--no-install"], env=self.t.env, cwd="/",
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)

    def test_runs_over_the_stand_ins(self) -> None:
        p = self.run_demo()
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertIn("train-step: done", p.stdout)
        self.assertIn("tierd stopped cleanly", p.stdout)
        self.assertEqual([pid for pid in self.tierd_pids() if pid_alive(pid)], [])

    def test_second_demo_while_one_runs(self) -> None:
        """A second demo in the same checkout is refused while the first runs: it took the first's tierd
        for one left over by a killed demo and stopped it, and the first went on against the second's."""
        first = self.start(hold=True)
        [tierd1] = self.tierd_pids()
        p = self.run_demo()
        self.assertEqual(p.returncode, 1, p.stdout + p.stderr)
        self.assertIn(f"another scripts/demo (pid {first.pid}) is running in {self.t.dir}", p.stderr)
        self.assertNotIn("left over", p.stdout)
        self.assertTrue(pid_alive(tierd1), "the second demo stopped the first one's tierd")
        self.assertEqual(self.tierd_pids(), [tierd1])
        self.let_go()
        out, err = first.communicate(timeout=60)
        self.assertEqual(first.returncode, 0, out + err)
        self.assertIn("tierd stopped cleanly", out)
        self.assertFalse(pid_alive(tierd1))

    def test_tierd_of_a_killed_demo(self) -> None:
        """A demo SIGKILLed (its trap cannot run) leaves its tierd; the next run stops it and runs."""
        first = self.start(hold=True)
        [tierd1] = self.tierd_pids()
        os.kill(first.pid, signal.SIGKILL)
        self.let_go()                                           # its train-step, orphaned, ends
        first.communicate(timeout=60)                           # (at EOF: the train-step has ended)
        self.assertTrue(pid_alive(tierd1))
        p = self.run_demo()
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertIn(f"stopping the tierd left over from an earlier demo (pid {tierd1})", p.stdout)
        self.assertFalse(pid_alive(tierd1))
        self.assertEqual([pid for pid in self.tierd_pids() if pid_alive(pid)], [])

    def test_lock_that_fails_for_another_reason(self) -> None:
        """flock(1) failing for a reason other than a lock held (./run on a file system without flock(2):
        status 65 or 71) was taken for a lock held by what a killed demo started, "wait for it to end",
        which never comes.  Said as what it is now, before tierd is started."""
        write_exe(os.path.join(self.t.bin, "flock"),
                  "#!/bin/sh\necho 'flock: 3: No locks available' >&2\nexit 71\n")
        p = self.run_demo()
        self.assertEqual(p.returncode, 1, p.stdout + p.stderr)
        self.assertIn(f"cannot lock run/demo.lock in {self.t.dir} (flock exit status 71", p.stderr)
        self.assertNotIn("wait for it to end", p.stderr)
        self.assertEqual(self.tierd_pids(), [])


class TestCiRun(unittest.TestCase):
    """.ci/run takes no arguments: --help says what it runs, anything else is refused before it runs
    anything (it went on with what CI runs, a Debian bootstrap and every test pass, whatever it was given)."""

    def setUp(self) -> None:
        self.t = Tree(self, ".ci/run", "scripts/lib.sh")
        self.ran = self.t.path("fresh-check-ran")
        write_exe(self.t.path("scripts", "fresh-check"), f"#!/bin/sh\ntouch '{self.ran}'\necho '0 passed, 0 failed'\n")

    def ci_run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([self.t.path(".ci", "run"), *args], env=self.t.env, cwd="/",
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)

    def test_help(self) -> None:
        for arg in ("--help", "-h"):
            p = self.ci_run(arg)
            self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
            self.assertIn("usage: .ci/run", p.stdout)
            self.assertIn("scripts/fresh-check", p.stdout)
            self.assertFalse(os.path.exists(self.ran), arg)

    def test_unknown_arguments_refused(self) -> None:
        for arg in ("--bogus", "HEAD", "--keep"):
            p = self.ci_run(arg)
            self.assertEqual(p.returncode, 1, p.stdout + p.stderr)
            self.assertIn(f".ci/run: error: unknown argument '{arg}'", p.stderr)
            self.assertIn("scripts/fresh-check", p.stderr)
            self.assertFalse(os.path.exists(self.ran), arg)


if __name__ == "__main__":
    tierd.main()
