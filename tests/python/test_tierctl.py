#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""tierctl, the built binary, against a real tierd: every verb's --json, errors and exit codes.

Jobs are made with the tier package (this build's libtier); tierctl runs as
a subprocess with --socket.  The results of tensors and evict are checked
against the job's real state (Tensor.stat() and the bytes read back).  The
permission tests run tierctl as uid/gid 65534 (nobody) and need root: they
skip otherwise.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import unittest

import tierd
from tierd import MiB

import tier

# Jobs linger (a minute) so that a job without connections can be seen lingering;
# every test detaches its jobs at the end, so they do not hold segments for the next.
CONFIG = tierd.CONFIG.replace("linger_sec = 0", "linger_sec = 60")

NOBODY = 65534


def tierctl_path() -> str:
    return os.path.join(tierd.build_dir(), "client", "tierctl")


def as_nobody() -> None:  # in the child, before exec
    os.setgroups([])
    os.setresgid(NOBODY, NOBODY, NOBODY)
    os.setresuid(NOBODY, NOBODY, NOBODY)


def default_signals() -> None:
    """In a tierctl child, before exec: SIGINT, SIGTERM and SIGHUP as a terminal's shell leaves them.  A
    test runner under nohup(1), or started in the background by a script, passes SIGHUP or SIGINT on
    ignored, and tierctl keeps a signal ignored as it inherited it: the tests that send one would wait."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


class TestTierctl(tierd.DaemonTestCase):
    config = CONFIG

    # -- helpers
    def ctl(self, *args: str, expect: int | None = 0, nobody: bool = False,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """Run tierctl --socket SOCKET ARGS; check its exit status when @expect is not None."""
        p = subprocess.run([tierctl_path(), "--socket", self.socket, *args], capture_output=True, text=True,
                           timeout=60, preexec_fn=as_nobody if nobody else None, env=env)
        if expect is not None:
            self.assertEqual(p.returncode, expect, f"tierctl {' '.join(args)}: stdout {p.stdout!r} stderr {p.stderr!r}")
        return p

    def ctl_json(self, *args: str) -> dict:
        return json.loads(self.ctl(*args, "--json").stdout)

    def detach_at_end(self, job: str) -> None:
        def detach() -> None:
            self.ctl("detach", job, expect=None)
        self.addCleanup(detach)

    def job_entry(self, name: str) -> dict | None:
        for j in self.ctl_json("jobs")["jobs"]:
            if j["name"] == name:
                return j
        return None

    def tensors(self, job: str) -> dict[str, dict]:
        doc = self.ctl_json("tensors", job)
        self.assertEqual(doc["job"], job)
        return {t["name"]: t for t in doc["tensors"]}

    # -- help and usage
    def test_help(self) -> None:
        p = self.ctl("--help", env=dict(os.environ, TIER_SOCKET="/x/y.sock"))
        self.assertIn("$TIER_SOCKET", p.stdout)
        self.assertIn("/x/y.sock", p.stdout)
        self.assertRegex(p.stdout, r"else /\S+\.sock")  # the built-in path
        for verb in ("status", "jobs", "tensors", "evict", "detach", "quota", "help"):
            self.assertRegex(p.stdout, rf"\n  {verb} ")
            own = self.ctl(verb, "--help").stdout
            self.assertTrue(own.startswith(f"Usage: tierctl {verb}"), own)
            self.assertEqual(self.ctl("help", verb).stdout, own)
        self.assertIn("quota set", self.ctl("help", "quota").stdout)
        self.assertIn("unknown command 'nosuch'", self.ctl("help", "nosuch", expect=2).stderr)
        # help's text is not JSON: its usage error says so (it was "unknown command '--json'")
        self.assertIn("takes no option but --help, not '--json'", self.ctl("help", "--json", expect=2).stderr)
        self.ctl("nosuch", expect=2)
        self.ctl(expect=2)

    def test_usage_errors(self) -> None:
        cases = [
            (["status", "extra"], "unexpected argument"),
            (["quota", "get", "--uid", "4294967295"], "--uid 4294967295 is out of range: an id is 0 to 4294967294"),
            (["quota", "set", "--group", "99999999999", "--host", "1G"], "--group 99999999999 is out of range"),
            (["status", "--watch=0"], "--watch takes seconds"),
            (["status", "--watch=0x1p-1"], "--watch takes seconds"),
            (["status", "--watch=1e0"], "--watch takes seconds"),
            (["jobs", "--bogus"], "unknown option '--bogus'"),
            (["tensors"], "no job given"),
            (["tensors", "a", "b"], "unexpected argument 'b'"),
            (["tensors", "--min-size", "10X", "j"], "'10X'"),
            (["tensors", "--min-size", "", "j"], "--min-size"),
            (["tensors", "--min-size", "-1", "j"], "'-1'"),
            (["tensors", "--min-size", "99999999999999999999", "j"], "below 16 EiB"),
            (["tensors", "--min-size"], "needs an argument"),
            (["evict", "--to", "vram", "j"], "--to takes nvme or host"),
            (["evict"], "no job given"),
            (["detach", ""], "job name is empty"),
            (["detach", "a", "b"], "unexpected argument"),
            (["quota", "set", "j", "--host", "10X"], "'10X'"),
            (["quota", "set", "j", "--host", "-1"], "'-1'"),
            (["quota", "get", "a", "b"], "unexpected argument"),
            (["quota"], "say get or set"),
            # the summary went to stderr as text: stdout holds the trace
            (["trace", "-o", "-", "--json-summary", "--seconds", "1"], "--json-summary with -o -"),
        ]
        for args, msg in cases:
            with self.subTest(args=args):
                p = self.ctl(*args, expect=2)
                self.assertIn(msg, p.stderr)
                self.assertEqual(p.stdout, "")

    def test_malformed_job_name(self) -> None:
        """A job name no job can have (control or bidi characters, not UTF-8, over 4096 bytes) is a usage error (2)
        for every verb that takes one, said before asking tierd: it was 'no job' (1), or sent as is."""
        # with the escaped text (util/escape.c, as tierd and libtier say it) a job an older tierd made under it was
        # restored under: it was not said; one too long to say is not said, nor cut
        names = [("a\tb", "contains control characters", "'a\\u0009b'"),
                 ("a\x7fb", "contains control characters", "'a\\u007fb'"),
                 ("a\x9bb", "contains control characters", "'a\\u009bb'"),  # C1: U+009B, a terminal's CSI
                 ("abc\u202egpj.exe", "contains the bidirectional format character U+202E",  # reads "abcexe.jpg"
                  "'abc\\u202egpj.exe'"),
                 ("a\udcffb", "is not valid UTF-8", "'a\\xffb'"),  # the byte 0xff, through surrogateescape
                 ("\x01" * 100, "contains control characters", "too long to say here"),
                 ("j" * 4097, "is too long", None)]
        verbs = [["tensors"], ["evict"], ["evict", "--to", "host"], ["detach"], ["quota", "get"],
                 ["quota", "set", "--host", "1M"]]
        for name, msg, escaped in names:
            for verb in verbs:
                with self.subTest(verb=verb, name=name[:8]):
                    p = self.ctl(*verb, name, expect=2)
                    self.assertIn(f"tierctl {' '.join(verb[:2] if verb[0] == 'quota' else verb[:1])}: the job "
                                  f"name {msg}", p.stderr)
                    if escaped:
                        self.assertIn(f"; a job an older tierd made under such a name was restored under its "
                                      f"escaped text, {escaped} (tierctl jobs lists the name it was restored under, "
                                      "if any)\n", p.stderr)
                    else:
                        self.assertNotIn("escaped", p.stderr)
                    self.assertNotIn("\\u0001", p.stderr)
                    self.assertEqual(p.stdout, "")
        # the longest name tierctl passes on is tierd's to judge: over its max_name (1), and a short one no job (1)
        self.assertIn("job name longer than max_name (255 bytes)", self.ctl("tensors", "j" * 4096, expect=1).stderr)
        self.assertIn("no job", self.ctl("tensors", "j" * 255, expect=1).stderr)

    def test_unreachable(self) -> None:
        for verb in (["status"], ["jobs"], ["tensors", "j"], ["evict", "j"], ["detach", "j"], ["quota", "get"]):
            p = subprocess.run([tierctl_path(), "--socket", "/nonexistent/tierd.sock", *verb], capture_output=True,
                               text=True, timeout=60)
            self.assertEqual(p.returncode, 1, verb)
            self.assertIn("/nonexistent/tierd.sock", p.stderr)

    def test_timeout_answered(self) -> None:
        """A tierd that answers is not cut short by --timeout, nor waited for without one (0)."""
        for t in ("0", "60", "0.5"):
            self.assertIn("tiers", self.ctl("--timeout", t, "--json", "status").stdout)

    def test_timeout_not_our_output(self) -> None:
        """--timeout bounds tierd's answer, not tierctl's own writing: a status that waited on a full stdout
        pipe (a pager not read on, a slow consumer) exited 3 saying tierd did not answer.  The pass does not
        depend on timing (no deadline runs while tierctl writes); the wait below only lets one run out."""
        r, w = os.pipe()
        fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, 4096)
        p = subprocess.Popen([tierctl_path(), "--socket", self.socket, "--timeout", "0.2", "status",
                              "--prometheus"], stdout=w, stderr=subprocess.PIPE, text=True)
        os.close(w)
        try:
            # until it waits in write(2) on the full pipe (x86-64 syscall 1; aarch64 64)
            for _ in range(6000):
                with open(f"/proc/{p.pid}/syscall") as f:
                    nr = f.read().split()[0]
                if nr in ("1", "64") and p.poll() is None:
                    break
                time.sleep(0.01)
            else:
                self.fail("tierctl never waited on its full stdout")
            time.sleep(0.6)             # past --timeout 0.2, counted from connecting
            with os.fdopen(r, "rb") as f:
                out = f.read()
            self.assertEqual(p.wait(timeout=60), 0, p.stderr.read())
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
            p.stderr.close()
        self.assertGreater(len(out), 4096)
        self.assertIn(b"tierd_tier_capacity_bytes", out)

    def test_empty_socket(self) -> None:
        """--socket "" is a usage error: libtier took it as "the default", so a script's --socket "$UNSET"
        reached $TIER_SOCKET or the system's tierd instead of failing."""
        p = subprocess.run([tierctl_path(), "--socket", "", "status"], capture_output=True, text=True, timeout=60,
                           env=dict(os.environ, TIER_SOCKET=self.socket))
        self.assertEqual(p.returncode, 2, p)
        self.assertIn("--socket needs a path", p.stderr)
        self.assertEqual(p.stdout, "")

    def test_unknown_job(self) -> None:
        for args in (["tensors", "nojob"], ["evict", "nojob"], ["evict", "--to", "host", "nojob"],
                     ["detach", "nojob"], ["quota", "get", "nojob"]):
            with self.subTest(args=args):
                p = self.ctl(*args, "--json", expect=1)
                self.assertIn("no job 'nojob'", p.stderr)
                self.assertEqual(p.stdout, "")

    # -- status, jobs
    def test_status_does_not_count_itself(self) -> None:
        base = self.ctl_json("status")["connections"]
        c = self.client("st-self")
        self.detach_at_end("st-self")
        c.create("t", 4096)
        doc = self.ctl_json("status")
        self.assertEqual(doc["connections"], base + 1)
        job = [j for j in doc["jobs"] if j["name"] == "st-self"][0]
        self.assertEqual(job["connections"], 1)
        self.assertIs(job["lingering"], False)
        self.assertIn("weight", job)
        table = self.ctl("status").stdout
        self.assertIn(f"{base + 1} connection", table)
        self.assertIn("WEIGHT", table)

    def test_jobs_and_linger(self) -> None:
        c = self.client("jobs-a")
        self.detach_at_end("jobs-a")
        t = c.create("t", 1 * MiB)
        with t.pin(tier.HOST) as g:
            g.memoryview()[:4] = b"abcd"
            g.dirty = True
        j = self.job_entry("jobs-a")
        self.assertIsNotNone(j)
        self.assertEqual(j["uid"], os.getuid())
        self.assertEqual(j["connections"], 1)
        self.assertIs(j["lingering"], False)
        self.assertEqual(j["tensors"], 1)
        self.assertGreaterEqual(j["usage"]["host"]["used"], 1 * MiB)
        self.assertGreaterEqual(j["weight"], 1)
        self.assertIn("jobs-a", self.ctl("jobs").stdout)
        self.assertIn("WEIGHT", self.ctl("jobs").stdout)

        c.close()
        j = self.job_entry("jobs-a")
        self.assertIs(j["lingering"], True)
        self.assertEqual(j["connections"], 0)
        self.assertGreater(j["linger_left_s"], 0)
        self.assertLessEqual(j["linger_left_s"], 60)
        self.assertRegex(self.ctl("jobs").stdout, r"jobs-a .* \d+\.\ds left")
        self.assertRegex(self.ctl("status").stdout, r"jobs-a .* left")
        st = [x for x in self.ctl_json("status")["jobs"] if x["name"] == "jobs-a"][0]
        self.assertIs(st["lingering"], True)
        self.assertGreater(st["linger_left_s"], 0)

        # a rank that comes back finds its data
        c2 = self.client("jobs-a")
        with c2.open("t").pin(tier.HOST) as g:
            self.assertEqual(bytes(g.memoryview()[:4]), b"abcd")
        self.assertIs(self.job_entry("jobs-a")["lingering"], False)

    def test_watch(self) -> None:
        p = subprocess.Popen([tierctl_path(), "--socket", self.socket, "status", "--json", "--watch", "0.1"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            docs: list[dict] = []
            buf = ""
            while len(docs) < 3:
                line = p.stdout.readline()
                self.assertTrue(line, "tierctl status --watch ended by itself")
                if line == "\n":  # not a tty: a blank line between outputs
                    continue
                buf += line
                docs.append(json.loads(buf))
                buf = ""
            for d in docs:
                self.assertIn("tiers", d)
            p.send_signal(signal.SIGINT)
            self.assertEqual(p.wait(30), 0, p.stderr.read())
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
            p.stdout.close()
            p.stderr.close()

    # -- tensors
    def test_tensors(self) -> None:
        c = self.client("tens")
        self.detach_at_end("tens")
        t0 = time.monotonic()
        a = c.create("a", 1 * MiB)
        b = c.create("b", 2 * MiB)
        c.create("never", 4096)
        with a.pin(tier.HOST) as g:
            g.memoryview()[:3] = b"xyz"
            g.dirty = True
        gb = b.pin(tier.HOST)
        self.addCleanup(gb.unpin)

        ts = self.tensors("tens")
        elapsed = time.monotonic() - t0
        self.assertEqual(set(ts), {"a", "b", "never"})
        ta = ts["a"]
        self.assertEqual(ta["size"], 1 * MiB)
        self.assertEqual(ta["copies"]["host"], {"state": "resident", "valid": True, "dirty": True, "pins": 0})
        self.assertEqual(ta["copies"]["nvme"]["state"], "absent")
        self.assertIs(ta["dirty"], True)
        self.assertIsInstance(ta["idle_s"], float)
        # a was used after t0, and tierd answered before elapsed was read (3 decimals: rounding)
        self.assertLessEqual(ta["idle_s"], elapsed + 0.0005)
        self.assertEqual(ts["b"]["pins"], 1)
        self.assertEqual(ts["b"]["copies"]["host"]["pins"], 1)
        self.assertIsNone(ts["never"]["idle_s"])
        self.assertEqual({k: v["state"] for k, v in ts["never"]["copies"].items()},
                         {"vram": "absent", "host": "absent", "nvme": "absent"})
        # what tierd says per tensor agrees with the tensor's own stat
        st = a.stat()
        for lvl in ("vram", "host", "nvme"):
            self.assertEqual(ta["copies"][lvl]["state"], st.state[lvl])
            self.assertEqual(ta["copies"][lvl]["pins"], st.pins[lvl])

        only = self.ctl_json("tensors", "--min-size", "2MiB", "tens")["tensors"]
        self.assertEqual([t["name"] for t in only], ["b"])
        table = self.ctl("tensors", "tens").stdout
        self.assertRegex(table, r"\na +1\.0 MiB +- +resident +- +0 +host ")
        self.assertRegex(table, r"\nnever .* never\n")
        self.assertIn("no tensors of that size", self.ctl("tensors", "--min-size", "1T", "tens").stdout)

    def test_tensors_dirty_in_two_tiers(self) -> None:
        """Dirty is newest data that NVMe lacks: a tensor written in host and read into VRAM is dirty in both
        (it was shown clean, being the only copy nowhere), and an evict writes it down."""
        c = self.client("dirty2")
        self.detach_at_end("dirty2")
        a = c.create("a", 1 * MiB)
        with a.pin(tier.HOST) as g:
            g.memoryview()[:3] = b"xyz"
            g.dirty = True
        with a.pin(tier.VRAM, tier.READ):
            pass
        ta = self.tensors("dirty2")["a"]
        for lvl in ("vram", "host"):
            self.assertEqual(ta["copies"][lvl], {"state": "resident", "valid": True, "dirty": True, "pins": 0})
        self.assertEqual(ta["copies"]["nvme"]["state"], "absent")
        self.assertIs(ta["dirty"], True)
        st = a.stat()
        self.assertTrue(st.dirty["vram"] and st.dirty["host"] and not st.dirty["nvme"])
        self.assertRegex(self.ctl("tensors", "dirty2").stdout, r"\na .* 0 +vram\+host ")

        doc = self.ctl_json("evict", "dirty2")
        self.assertEqual(doc["bytes_written"], 1 * MiB)
        ta = self.tensors("dirty2")["a"]
        self.assertIs(ta["dirty"], False)
        self.assertFalse(any(cp["dirty"] for cp in ta["copies"].values()))
        self.assertRegex(self.ctl("tensors", "dirty2").stdout, r"\na .* 0 +- ")

    def test_tensors_dead_and_unwritten(self) -> None:
        """A dead tensor (a plan dropped its bytes, as its next access overwrites it whole) and a never
        written one were listed alike, as one with no copy; the listing says which is which."""
        c = self.client("dead")
        self.detach_at_end("dead")
        x = c.create("x", 1 * MiB)
        y = c.create("y", 1 * MiB)
        c.create("never", 4096)
        for t in (x, y):
            with t.pin(tier.HOST, tier.WRITE) as g:
                g.memoryview()[:] = b"X" * MiB
        with c.plan() as p:
            p.add(0, x, tier.HOST, tier.READ)
            p.add(1, y, tier.HOST, tier.READ)
            p.add(2, x, tier.HOST, tier.WRITE)   # x's next access after phase 0 overwrites it whole
            p.submit()
        c.phase(0)
        c.phase(1)
        y.stat()    # a request of the plan's connection: tierd takes phase 1's marker first (phase 0 is over)
        ts = self.tensors("dead")
        self.assertEqual((ts["x"]["state"], ts["x"]["lost_why"]), ("dead", None))
        self.assertEqual(ts["y"]["state"], "data")
        self.assertEqual(ts["never"]["state"], "unwritten")
        table = self.ctl("tensors", "dead").stdout
        self.assertRegex(table, r"^NAME .* DIRTY +DATA +LAST USE\n")
        self.assertRegex(table, r"\nx .* - +dead +")
        self.assertRegex(table, r"\nnever .* - +unwritten +never\n")
        self.assertNotIn("is lost", table)

    def test_tensors_lost(self) -> None:
        """A lost tensor (its newest data was in memory only when tierd was killed) was listed as one never
        written; the listing says it is lost, and why."""
        d = tierd.Tierd(CONFIG.replace("linger_sec = 60", "linger_sec = 300"))
        self.addCleanup(d.cleanup)
        d.start()
        c = tier.Client("lost", socket=d.socket)
        self.addCleanup(c.close)
        a = c.create("a", 1 * MiB)
        c.create("kept", 1 * MiB)
        with a.pin(tier.HOST, tier.WRITE) as g:
            g.memoryview()[:] = b"A" * MiB
        d.kill_and_start()
        ctl = [tierctl_path(), "--socket", d.socket, "tensors", "lost"]
        doc = json.loads(subprocess.run(ctl + ["--json"], capture_output=True, text=True, timeout=60,
                                        check=True).stdout)
        ts = {t["name"]: t for t in doc["tensors"]}
        self.assertEqual(ts["a"]["state"], "lost")
        self.assertIn("in memory, not on NVMe, when tierd stopped", ts["a"]["lost_why"])
        self.assertEqual((ts["kept"]["state"], ts["kept"]["lost_why"]), ("unwritten", None))
        table = subprocess.run(ctl, capture_output=True, text=True, timeout=60, check=True).stdout
        self.assertRegex(table, r"\na .* - +lost +")
        self.assertIn("\na is lost: its newest data was in memory, not on NVMe, when tierd stopped; its reads "
                      "fail (ENODATA) until it is written whole\n", table)

    def test_tensors_many_pages(self) -> None:
        """More tensors than one reply holds (1024 a page): all are listed, once."""
        c = self.client("tens-many")
        self.detach_at_end("tens-many")
        names = {f"tensor-{i:05d}-" + "n" * 100 for i in range(1500)}
        for n in sorted(names):
            c.create(n, 4096)
        listed = [t["name"] for t in self.ctl_json("tensors", "tens-many")["tensors"]]
        self.assertEqual(len(listed), len(names))
        self.assertEqual(set(listed), names)

    # -- evict
    def test_evict_to_nvme(self) -> None:
        c = self.client("ev")
        self.detach_at_end("ev")
        a = c.create("a", 1 * MiB)
        p = c.create("p", 1 * MiB)
        pattern = bytes(range(256)) * 4096
        with a.pin(tier.HOST) as g:
            g.memoryview()[:] = pattern
            g.dirty = True
        gp = p.pin(tier.HOST)
        self.addCleanup(gp.unpin)

        doc = self.ctl_json("evict", "ev")
        self.assertEqual(doc["to"], "nvme")
        self.assertEqual(doc["evicted"], 1)
        self.assertEqual(doc["bytes_written"], 1 * MiB)
        self.assertEqual(doc["bytes_dropped"], 1 * MiB)
        self.assertEqual(doc["pinned"], 1)
        self.assertEqual(doc["pinned_bytes"], 1 * MiB)
        self.assertEqual(doc["failed"], 0)

        st = a.stat()
        self.assertEqual(st.state["host"], "absent")
        self.assertEqual(st.state["vram"], "absent")
        self.assertEqual(st.state["nvme"], "resident")
        ta = self.tensors("ev")["a"]
        self.assertEqual(ta["copies"]["nvme"], {"state": "resident", "valid": True, "dirty": False, "pins": 0})
        self.assertEqual(ta["copies"]["host"]["state"], "absent")
        self.assertIs(ta["dirty"], False)
        self.assertEqual(p.stat().state["host"], "resident")  # pinned: left alone
        with a.pin(tier.HOST) as g:
            self.assertEqual(bytes(g.memoryview()), pattern)
            g.dirty = False  # read only: the NVMe copy stays valid

        # again: a's host copy is clean now (its NVMe copy is valid): nothing is written
        doc = self.ctl_json("evict", "ev")
        self.assertEqual(doc["evicted"], 1)
        self.assertEqual(doc["bytes_written"], 0)
        self.assertEqual(doc["bytes_dropped"], 1 * MiB)
        out = self.ctl("evict", "ev").stdout
        self.assertIn("0 tensor(s) evicted to nvme", out)
        self.assertIn("skipped 1 pinned", out)

    def test_evict_to_host(self) -> None:
        c = self.client("ev-host")
        self.detach_at_end("ev-host")
        v = c.create("v", 1 * MiB)
        with v.pin(tier.VRAM) as g:
            g.dirty = True
        self.assertEqual(v.stat().state["vram"], "resident")
        doc = self.ctl_json("evict", "--to", "host", "ev-host")
        self.assertEqual((doc["to"], doc["evicted"], doc["bytes_written"]), ("host", 1, 1 * MiB))
        st = v.stat()
        self.assertEqual((st.state["vram"], st.state["host"]), ("absent", "resident"))
        self.assertTrue(st.dirty["host"])  # the only copy now: dirty until it reaches NVMe

    # -- detach
    def test_detach(self) -> None:
        c = self.client("det")
        t = c.create("t", 1 * MiB)
        with t.pin(tier.HOST) as g:
            g.dirty = True
        def host_used() -> int:
            return [x for x in self.ctl_json("status")["tiers"] if x["tier"] == "host"][0]["used"]
        used = host_used()
        doc = self.ctl_json("detach", "det")
        self.assertEqual(doc["job"], "det")
        self.assertEqual(doc["connections"], 1)
        self.assertEqual(doc["tensors"], 1)
        self.assertGreaterEqual(doc["freed"]["host"], 1 * MiB)
        self.assertIsNone(self.job_entry("det"))
        self.assertLessEqual(host_used(), used - 1 * MiB)  # its usage is gone with it
        # the job's process is told why
        with self.assertRaises(tier.TierError) as cm:
            t.pin(tier.HOST)
        self.assertIn("detached", str(cm.exception))
        self.assertNotIn("shutting down", str(cm.exception))    # tierd runs on: only this job was ended
        self.assertIn("det", self.d.log_text())
        self.ctl("detach", "det", expect=1)

        # a lingering job (no connection) goes too, with its usage
        c2 = self.client("det2")
        c2.create("t", 1 * MiB).pin(tier.HOST).unpin(True)
        c2.close()
        self.assertIs(self.job_entry("det2")["lingering"], True)
        out = self.ctl("detach", "det2").stdout
        self.assertIn("0 connection(s) closed, 1 tensor(s) freed", out)
        self.assertIsNone(self.job_entry("det2"))

    # -- permissions
    def test_permissions(self) -> None:
        if os.geteuid() != 0:
            self.skipTest("needs root to run tierctl as uid 65534")
        try:
            subprocess.run([tierctl_path(), "--version"], capture_output=True, preexec_fn=as_nobody, check=False)
        except PermissionError:
            # a checkout under a 0700 directory (mktemp -d): the build is out of nobody's reach
            self.skipTest(f"uid {NOBODY} cannot reach {tierctl_path()} (a parent directory is not searchable)")
        # let nobody reach the socket
        os.chmod(self.d.dir, 0o755)
        os.chmod(self.socket, 0o666)
        c = self.client("perm")
        self.detach_at_end("perm")
        c.create("t", 4096)
        for args, what in ((["tensors", "perm"], "list the tensors of"), (["evict", "perm"], "evict"),
                           (["detach", "perm"], "detach")):
            with self.subTest(args=args):
                p = self.ctl(*args, nobody=True, expect=1)
                self.assertIn(f"uid {NOBODY} (pid ", p.stderr)
                self.assertIn(f"may not {what} job 'perm'", p.stderr)
                m = re.search(r"pid (\d+)", p.stderr)
                self.assertIsNotNone(m)
                self.assertIn(f"Denied: uid {NOBODY} (pid {m.group(1)}) may not {what} job 'perm'",
                              self.d.log_text())
                p = self.ctl(*args, "--json", nobody=True, expect=1)
                self.assertEqual(p.stdout, "")
        p = self.ctl("quota", "set", "perm", "--host", "1M", nobody=True, expect=1)
        self.assertIn("tier-admin", p.stderr)
        # nobody may still look
        self.assertEqual(len([j for j in json.loads(self.ctl("jobs", "--json", nobody=True).stdout)["jobs"]
                              if j["name"] == "perm"]), 1)
        # the job is intact, and root may
        self.assertIsNotNone(self.job_entry("perm"))
        self.assertIn("t", self.tensors("perm"))

    def test_quota_get_others_not_shown(self) -> None:
        """quota get without a target, as a user who may not read other users' jobs: it says how many it did
        not show (it said "no jobs" while jobs ran)."""
        if os.geteuid() != 0:
            self.skipTest("needs root to run tierctl as uid 65534")
        try:
            subprocess.run([tierctl_path(), "--version"], capture_output=True, preexec_fn=as_nobody, check=False)
        except PermissionError:
            self.skipTest(f"uid {NOBODY} cannot reach {tierctl_path()} (a parent directory is not searchable)")
        os.chmod(self.d.dir, 0o755)
        os.chmod(self.socket, 0o666)
        self.client("others")
        self.detach_at_end("others")
        n = len(json.loads(self.ctl("jobs", "--json").stdout)["jobs"])
        self.assertGreaterEqual(n, 1)
        out = self.ctl("quota", "get", nobody=True).stdout
        self.assertNotIn("no jobs", out)
        self.assertIn(f"{n} job(s) of other users not shown (needs root or group tier-admin)", out)
        self.assertEqual(json.loads(self.ctl("quota", "get", "--json", nobody=True).stdout),
                         {"jobs": [], "not_shown": n})
        # root sees them all
        doc = json.loads(self.ctl("quota", "get", "--json").stdout)
        self.assertEqual((len(doc["jobs"]), doc["not_shown"]), (n, 0))
        self.assertNotIn("not shown", self.ctl("quota", "get").stdout)

    # -- trace: Ctrl-C stops early and still writes the file
    def test_trace_ctrl_c(self) -> None:
        if os.geteuid() != 0:
            p = self.ctl("trace", "--seconds", "1", "-o", os.path.join(self.d.dir, "t.json"), expect=1)
            self.assertIn("permission denied", p.stderr)
            self.skipTest("tracing needs root or group tier-admin: only the refusal was checked")
        c = self.client("tr")
        self.detach_at_end("tr")
        a = c.create("a", 1 * MiB)
        out = os.path.join(self.d.dir, "trace.json")
        p = subprocess.Popen([tierctl_path(), "--socket", self.socket, "trace", "--seconds", "600", "-o", out,
                              "--json-summary"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             preexec_fn=default_signals)
        try:
            # its first line says the trace runs (or why not)
            self.assertIn("Tracing tierd for 600 s", p.stderr.readline())
            with a.pin(tier.HOST) as g:
                g.memoryview()[:] = b"\x5a" * MiB
                g.dirty = True
            self.assertEqual(self.ctl_json("evict", "tr")["bytes_written"], 1 * MiB)
            p.send_signal(signal.SIGINT)
            self.assertEqual(p.wait(60), 0, p.stderr.read())
            summary = json.loads(p.stdout.read())
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
            p.stdout.close()
            p.stderr.close()
        with open(out) as f:
            doc = json.load(f)
        self.assertEqual(summary["file"], out)
        self.assertEqual(summary["dropped"], 0)
        link = summary["links"]["host->nvme"]
        self.assertEqual(link["counted"], link["traced"])
        self.assertGreaterEqual(link["traced"], 1 * MiB)
        xfers = [e for e in doc["traceEvents"] if e.get("cat") == "transfer" and e["args"]["job"] == "tr"]
        self.assertIn(("a", "host->nvme", 1 * MiB), [(e["name"], e["args"]["link"], e["args"]["bytes"]) for e in xfers])
        self.assertEqual(doc["otherData"]["link_bytes_traced"]["host->nvme"], link["traced"])
        # tracing stopped with the verb: another trace may start at once
        self.ctl("trace", "--seconds", "1", "-o", out)

    def test_trace_hangup(self) -> None:
        """A hangup (SIGHUP: the terminal or the ssh session gone) during the recording ends it as Ctrl-C
        does: the file is written, and nothing is left beside it.  It killed tierctl, which left the
        OUT.XXXXXX it writes beside the file there for good (and no trace)."""
        if os.geteuid() != 0:
            self.skipTest("tracing needs root or group tier-admin")
        d = tempfile.mkdtemp(prefix="hup.", dir=self.d.dir)
        out = os.path.join(d, "trace.json")
        p = subprocess.Popen([tierctl_path(), "--socket", self.socket, "trace", "--seconds", "600", "-o", out],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=default_signals)
        try:
            self.assertIn("Tracing tierd for 600 s", p.stderr.readline())  # the file beside it is made
            p.send_signal(signal.SIGHUP)
            self.assertEqual(p.wait(60), 0, p.stderr.read())
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
            p.stdout.close()
            p.stderr.close()
        self.assertEqual(os.listdir(d), ["trace.json"])
        with open(out) as f:
            self.assertIn("traceEvents", json.load(f))

    def wait_connecting(self, p: subprocess.Popen[str]) -> None:
        """Return once tierctl @p has its socket (/proc/PID/fd): connecting to tierd, or waiting for its answer."""
        def has_socket() -> bool:
            try:
                return any(os.readlink(f"/proc/{p.pid}/fd/{n}").startswith("socket:")
                           for n in os.listdir(f"/proc/{p.pid}/fd"))
            except OSError:
                return False
        while not has_socket():
            self.assertIsNone(p.poll(), "tierctl exited before connecting")
            time.sleep(0.01)

    def test_trace_interrupted_before_recording(self) -> None:
        """Ctrl-C while tierctl is still connecting or starting the trace stops tierctl at once, even while
        tierd does not answer, and leaves -o's file as it was.  It stayed pending behind the signals blocked
        from before the connection: the recording's wait took it at once, writing an empty trace over the
        file with exit 0; and then, to a tierd that does not answer, it did nothing until --timeout ran out
        (exit 3).  tierd is stopped (SIGSTOP) so that the signal lands while tierctl waits for its answer
        whatever the timing: it is sent once tierctl has its socket (/proc/PID/fd), and tierctl must be gone
        before tierd is continued."""
        if os.geteuid() != 0:
            self.skipTest("tracing needs root or group tier-admin")
        assert self.d.proc is not None
        d = tempfile.mkdtemp(prefix="int.", dir=self.d.dir)
        out = os.path.join(d, "trace.json")
        with open(out, "w") as f:
            f.write("earlier")
        os.kill(self.d.proc.pid, signal.SIGSTOP)
        p = None
        try:
            p = subprocess.Popen([tierctl_path(), "--socket", self.socket, "--timeout", "600", "trace",
                                  "--seconds", "600", "-o", out],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 preexec_fn=default_signals)

            self.wait_connecting(p)
            p.send_signal(signal.SIGINT)
            try:
                self.assertEqual(p.wait(60), -signal.SIGINT, "tierctl did not stop while tierd does not answer")
            except subprocess.TimeoutExpired:
                self.fail("Ctrl-C did not stop tierctl while it waited for a stopped tierd")
        finally:
            os.kill(self.d.proc.pid, signal.SIGCONT)
            if p is not None:
                if p.poll() is None:
                    p.kill()
                    p.wait()
                p.stdout.close()
                p.stderr.close()
        self.assertEqual(os.listdir(d), ["trace.json"])
        with open(out) as f:
            self.assertEqual(f.read(), "earlier")
        # nothing was left running: another one starts
        self.ctl("trace", "--seconds", "1", "-o", os.path.join(d, "next.json"))

    def test_trace_hangup_ignored(self) -> None:
        """Under nohup (SIGHUP ignored, as inherited) a hangup is ignored: the recording runs its time and the
        file is written.  tierctl blocked SIGHUP whatever its disposition, so a hangup while it connected
        stayed pending: it dropped the recording and, the signal ignored once unblocked, exited 1 without a
        word, leaving the file as it was; one during the recording stopped it early (sigtimedwait() takes an
        ignored signal that is blocked).  tierd is stopped (SIGSTOP) until the hangup is sent (once tierctl has
        its socket), so that it lands while tierctl connects whatever the timing; then tierctl's SIGHUP is seen ignored and not
        blocked (/proc/PID/status) while it records, and Ctrl-C ends the recording."""
        if os.geteuid() != 0:
            self.skipTest("tracing needs root or group tier-admin")
        assert self.d.proc is not None
        d = tempfile.mkdtemp(prefix="nohup.", dir=self.d.dir)
        out = os.path.join(d, "trace.json")
        with open(out, "w") as f:
            f.write("earlier")

        def sig_mask(pid: int, field: str) -> int:
            with open(f"/proc/{pid}/status") as f:
                return int(next(ln for ln in f if ln.startswith(field + ":")).split()[1], 16)

        def nohup() -> None:  # in the child, before exec: what nohup(1) does
            signal.signal(signal.SIGHUP, signal.SIG_IGN)

        hup = 1 << (signal.SIGHUP - 1)
        os.kill(self.d.proc.pid, signal.SIGSTOP)
        p = None
        try:
            p = subprocess.Popen([tierctl_path(), "--socket", self.socket, "--timeout", "600", "trace",
                                  "--seconds", "600", "-o", out],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=nohup)
            self.wait_connecting(p)
            p.send_signal(signal.SIGHUP)
            os.kill(self.d.proc.pid, signal.SIGCONT)
            self.assertIn("Tracing tierd for 600 s", p.stderr.readline())
            self.assertTrue(sig_mask(p.pid, "SigIgn") & hup, "tierctl's SIGHUP is no longer ignored")
            self.assertFalse(sig_mask(p.pid, "SigBlk") & hup, "tierctl waits for an ignored SIGHUP")
            p.send_signal(signal.SIGINT)
            self.assertEqual(p.wait(60), 0, p.stderr.read())
        finally:
            os.kill(self.d.proc.pid, signal.SIGCONT)
            if p is not None:
                if p.poll() is None:
                    p.kill()
                    p.wait()
                p.stdout.close()
                p.stderr.close()
        self.assertEqual(os.listdir(d), ["trace.json"])
        with open(out) as f:
            self.assertIn("traceEvents", json.load(f))

    def test_trace_failure_keeps_output(self) -> None:
        """A trace that fails (no tierd, refused, another trace running) leaves -o's file as it was, and
        a device, FIFO or link named by -o is written through, never replaced or removed: it used to
        be truncated at once and removed at the failure (a second trace removed the first one's
        output).  A signed or spaced --seconds is a usage error."""
        d = self.d.dir
        keep = os.path.join(d, "keep.json")
        with open(keep, "w") as f:
            f.write("x")
        target = os.path.join(d, "target.json")
        with open(target, "w") as f:
            f.write("y")
        link = os.path.join(d, "link.json")
        os.symlink(target, link)
        for out in (keep, link):
            p = subprocess.run([tierctl_path(), "--socket", "/nonexistent/tierd.sock", "trace", "--seconds", "1",
                                "-o", out], capture_output=True, text=True, timeout=60)
            self.assertEqual(p.returncode, 1, p.stderr)
        with open(keep) as f:
            self.assertEqual(f.read(), "x")
        self.assertTrue(os.path.islink(link))
        with open(target) as f:
            self.assertEqual(f.read(), "y")
        self.assertEqual(sorted(n for n in os.listdir(d) if n.startswith(("keep.json.", "link.json."))), [])
        for bad in ("+5", " 5", "-1"):
            self.assertIn("--seconds", self.ctl("trace", "--seconds", bad, "-o", keep, expect=2).stderr)
        if os.geteuid() != 0:
            self.skipTest("tracing needs root or group tier-admin: the rest needs a running trace")
        out = os.path.join(d, "first.json")
        p = subprocess.Popen([tierctl_path(), "--socket", self.socket, "trace", "--seconds", "600", "-o", out],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=default_signals)
        try:
            self.assertIn("Tracing tierd for 600 s", p.stderr.readline())
            self.assertIn("trace failed", self.ctl("trace", "--seconds", "1", "-o", out, expect=1).stderr)
            p.send_signal(signal.SIGINT)
            self.assertEqual(p.wait(60), 0, p.stderr.read())
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
            p.stdout.close()
            p.stderr.close()
        with open(out) as f:
            self.assertIn("traceEvents", json.load(f))

    def test_output_to_dev_full(self) -> None:
        """Output that cannot be written (stdout on /dev/full) is a failure with a message, for every verb
        that prints: --version and --help exited 0 (main() returned before its check of stdout)."""
        if not os.access("/dev/full", os.W_OK):
            self.skipTest("no writable /dev/full")
        c = self.client("full")
        self.detach_at_end("full")
        c.create("t", 4096)
        out = os.path.join(self.d.dir, "full-trace.json")
        cases = [["--version"], ["--help"], ["help"], ["help", "quota"], ["status"], ["--json", "status"],
                 ["jobs"], ["jobs", "--json"], ["tensors", "full"], ["tensors", "--json", "full"],
                 ["quota", "get"], ["quota", "get", "full"], ["quota", "get", "--json", "full"],
                 ["quota", "--help"], ["status", "--help"]]
        if os.geteuid() == 0:
            cases.append(["trace", "--seconds", "1", "-o", out, "--json-summary"])
        for args in cases:
            with open("/dev/full", "w") as full:
                p = subprocess.run([tierctl_path(), "--socket", self.socket, *args], stdout=full,
                                   stderr=subprocess.PIPE, text=True, timeout=60)
            self.assertEqual(p.returncode, 1, f"tierctl {' '.join(args)} >/dev/full: {p.stderr!r}")
            self.assertIn("cannot write the output", p.stderr, args)

    def test_output_to_closed_stdout(self) -> None:
        """stdout closed by the caller (tierctl status >&-): the control socket took fd 1, the status text
        went into tierd's socket and tierctl exited 0 without a word.  Now a write error, as coreutils'."""
        for args in (["status"], ["--json", "status"], ["--version"]):
            p = subprocess.run([tierctl_path(), "--socket", self.socket, *args], stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True, timeout=60,
                               preexec_fn=lambda: os.close(1))
            self.assertEqual(p.returncode, 1, f"tierctl {' '.join(args)} >&-: {p.stderr!r}")
            self.assertIn("cannot write the output", p.stderr, args)

    # -- quota keeps working inside the verb table
    def test_status_nvme_reserved(self) -> None:
        """The NVMe room kept for a job's unused nvme_min: status showed the room free while other jobs'
        placements failed naming guarantees.  Shown per tier (RESERVED, "reserved"), per job ("usage"
        "nvme" "reserved") and as tierd_tier_reserved_bytes; a lingering job yields it."""
        self.ctl("quota", "set", "nvres", "--nvme-min", "64M")
        self.addCleanup(lambda: self.ctl("quota", "set", "nvres", "--clear", expect=None))
        c = self.client("nvres")
        self.detach_at_end("nvres")
        t = c.create("t", 8 * MiB)
        with t.pin(tier.HOST, tier.WRITE) as g:
            g.memoryview()[0:4] = b"data"
        t.evict(tier.NVME)
        doc = self.ctl_json("status")
        nvme = [x for x in doc["tiers"] if x["tier"] == "nvme"][0]
        self.assertEqual(nvme["reserved"], 56 * MiB)            # 64M less the 8M it uses
        self.assertEqual([x["reserved"] for x in doc["tiers"] if x["tier"] != "nvme"], [0, 0])
        usage = [j for j in doc["jobs"] if j["name"] == "nvres"][0]["usage"]
        self.assertEqual((usage["nvme"]["guarantee"], usage["nvme"]["reserved"]), (64 * MiB, 56 * MiB))
        out = self.ctl("status").stdout
        self.assertRegex(out, r"\nTIER +BACKEND +CAPACITY +USED +PINNED +RESERVED +USE%\n")
        self.assertRegex(out, r"\nnvme .* 56\.0 MiB +[0-9.]+%\n")
        self.assertRegex(out, r"\nhost .* - +[0-9.]+%\n")
        self.assertIn("nvme: 56.0 MiB of the 248.0 MiB free is reserved for the NVMe guarantees (nvme_min) jobs "
                      "do not use yet; other jobs' copies get only the rest: nvres 56.0 MiB\n", out)
        self.assertIn('tierd_tier_reserved_bytes{tier="nvme"} 58720256\n', self.ctl("status", "--prometheus").stdout)
        # lingering (no connection left), the job claims no room
        c.close()
        doc = self.ctl_json("status")
        self.assertEqual([x["reserved"] for x in doc["tiers"] if x["tier"] == "nvme"], [0])
        self.assertNotIn("is reserved", self.ctl("status").stdout)

    def test_quota_json(self) -> None:
        c = self.client("qj")
        self.detach_at_end("qj")
        c.create("t", 4096)
        q = json.loads(self.ctl("quota", "get", "--json", "qj").stdout)
        self.assertEqual(q["job"], "qj")
        for k in ("vram", "host", "nvme", "weight"):
            self.assertIn(k, q)
        doc = json.loads(self.ctl("--json", "quota", "get").stdout)
        self.assertIn("qj", [j["job"] for j in doc["jobs"]])


class TestRestoredLongName(unittest.TestCase):
    def test_restored_job_over_max_name(self) -> None:
        """A job restored from the NVMe index after a restart with a smaller [limits] max_name keeps its
        name: tierctl names it still.  d6f6ec2 refused every name over max_name before looking (-ENAMETOOLONG,
        'job name longer than max_name'): such a job could no longer be listed, evicted or detached."""
        d = tierd.Tierd(CONFIG.replace("max_inflight = 64", "max_inflight = 64\nmax_name = 400"))
        self.addCleanup(d.cleanup)
        d.start()
        name = "j" * 300
        c = tier.Client(name, socket=d.socket)
        t = c.create("t", MiB)
        with t.pin(tier.HOST, tier.WRITE) as g:
            g.memoryview()[0:4] = b"kept"
        t.evict(tier.NVME)
        t.close()
        c.close()
        self.assertEqual(d.stop(), 0)
        with open(d.config, "w") as f:
            f.write(CONFIG.replace("@DIR@", d.dir))         # max_name 255 (the default)
        d.start()

        def ctl(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([tierctl_path(), "--socket", d.socket, *args], capture_output=True, text=True,
                                  timeout=60)

        p = ctl("tensors", name)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("t", p.stdout.split())
        p = ctl("detach", name)
        self.assertEqual(p.returncode, 0, p.stderr)
        # a name over max_name that no job has is still said to be one no job can have
        self.assertIn("job name longer than max_name (255 bytes)", ctl("tensors", "k" * 300).stderr)


class TestTimeout(unittest.TestCase):
    """--timeout: a tierd that accepts the connection but never answers (stopped, wedged).  The stand-in is
    a listening socket nobody accepts on: the kernel completes the connect and queues the Hello, no answer
    ever comes.  Before --timeout every verb waited for ever (and --timeout was an unknown option, exit 2).
    Only the outcome is asserted, never how long it took: a hang is the test runner's timeout."""

    def setUp(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="tierctl-timeout-")
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.path = os.path.join(self.dir, "silent.sock")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        self.addCleanup(self.sock.close)
        self.sock.bind(self.path)
        self.sock.listen(16)

    def ctl(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([tierctl_path(), "--socket", self.path, *args], capture_output=True, text=True,
                              timeout=60)

    def assert_timed_out(self, p: subprocess.CompletedProcess[str], seconds: str) -> None:
        self.assertEqual(p.returncode, 3, p)
        self.assertIn(f"tierd at {self.path} did not answer within {seconds} s", p.stderr)
        self.assertEqual(p.stdout, "")

    def test_every_verb_gives_up(self) -> None:
        for args in (["status"], ["status", "--json"], ["status", "--watch", "1"], ["--json", "jobs"],
                     ["tensors", "j"], ["detach", "j"], ["quota", "get"], ["quota", "get", "j"],
                     ["quota", "set", "j", "--host", "1G"], ["--timeout", "0.3", "evict", "j"]):
            with self.subTest(args=args):
                self.assert_timed_out(self.ctl("--timeout", "0.2", *args), "0.3" if "evict" in args else "0.2")

    def test_trace_leaves_no_file(self) -> None:
        """trace writes beside its output and renames: the deadline removes what it wrote there."""
        out = os.path.join(self.dir, "trace.json")
        self.assert_timed_out(self.ctl("--timeout", "0.2", "trace", "--seconds", "1", "-o", out), "0.2")
        self.assertEqual(sorted(os.listdir(self.dir)), ["silent.sock"])

    def test_bad_timeout(self) -> None:
        for v in ("", "-1", "abc", "1e3", "0x10", "86401", " 1", "1s"):
            with self.subTest(v=v):
                p = self.ctl("--timeout", v, "status")
                self.assertEqual(p.returncode, 2, p)
                self.assertIn(f"--timeout takes seconds from 0 (no limit) to 86400, not '{v}'", p.stderr)
        self.assertIn("--timeout SEC", subprocess.run([tierctl_path(), "--help"], capture_output=True, text=True,
                                                      timeout=60).stdout)


if __name__ == "__main__":
    tierd.main()
