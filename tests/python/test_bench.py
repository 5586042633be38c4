#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""tierctl bench, the built binary: the sweep on small scratch files, its JSON, errors, and a real tierd.

The sweeps are small (4M scratch, two block sizes, two depths, byte-bound
cells) so they finish in a second or two; nothing here checks a speed, only
that every cell was measured (gbps > 0), that the results are consistent
with each other, that --write-config's drop-in passes tierd --check-config
(tierd's own parser and checks), and that scratch files never outlive a run
and never replace a target's data.  Directories are made under /var/tmp
(O_DIRECT: a tmpfs refuses it).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import unittest

import tierd

NOBODY = 65534
# Small and quick: every cell is bound by its bytes (one pass over 4M).
SMALL = ["--size", "4M", "--bs", "128K,1M", "--qd", "1,4", "--seconds-per-cell", "5", "--sustain", "0", "--no-fio"]
BS = [128 << 10, 1 << 20]
QD = [1, 4]


def tierctl_path() -> str:
    return os.path.join(tierd.build_dir(), "client", "tierctl")


def tierd_path() -> str:
    return os.path.join(tierd.build_dir(), "daemon", "tierd")


def as_nobody() -> None:  # in the child, before exec
    os.setgroups([])
    os.setresgid(NOBODY, NOBODY, NOBODY)
    os.setresuid(NOBODY, NOBODY, NOBODY)


def o_direct_works(d: str) -> bool:
    p = os.path.join(d, ".probe")
    try:
        fd = os.open(p, os.O_RDWR | os.O_CREAT | os.O_DIRECT, 0o600)
    except OSError:
        return False
    os.close(fd)
    os.unlink(p)
    return True


def sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


class BenchCase(unittest.TestCase):
    """A scratch directory (two, for striping) and a private $XDG_CACHE_HOME."""

    def setUp(self) -> None:
        self.dirs = [tempfile.mkdtemp(prefix="tierctl-bench.", dir="/var/tmp") for _ in range(2)]
        for d in self.dirs:
            os.chmod(d, 0o777)
            self.addCleanup(shutil.rmtree, d, True)
        if not o_direct_works(self.dirs[0]):
            self.skipTest("/var/tmp refuses O_DIRECT here")
        self.cache = tempfile.mkdtemp(prefix="tierctl-bench-cache.", dir="/var/tmp")
        self.addCleanup(shutil.rmtree, self.cache, True)
        self.env = dict(os.environ, XDG_CACHE_HOME=self.cache)

    def bench(self, *args: str, expect: int | None = 0, socket: str | None = None,
              nobody: bool = False) -> subprocess.CompletedProcess[str]:
        cmd = [tierctl_path()] + (["--socket", socket] if socket else []) + ["bench", *args]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=self.env,
                           preexec_fn=as_nobody if nobody else None)
        if expect is not None:
            self.assertEqual(p.returncode, expect, f"{' '.join(cmd)}: stdout {p.stdout!r} stderr {p.stderr!r}")
        return p

    def assert_no_scratch(self) -> None:
        for d in self.dirs:
            self.assertEqual([f for f in os.listdir(d) if "tierctl-bench" in f], [], f"scratch left in {d}")

    def check_cells(self, doc: dict, targets: list[str]) -> None:
        want = {(t, op, bs, qd) for t in targets for op in ("read", "write") for bs in BS for qd in QD}
        got = [(c["target"], c["op"], c["bs"], c["qd"]) for c in doc["cells"]]
        self.assertEqual(len(got), len(want), "one cell per target x op x bs x qd")
        self.assertEqual(set(got), want)
        for c in doc["cells"]:
            self.assertGreater(c["gbps"], 0, c)
            self.assertGreater(c["iops"], 0, c)
            self.assertGreater(c["lat_us_p50"], 0, c)
            self.assertGreater(c["bytes"], 0, c)
            self.assertIsInstance(c["suspect"], bool)
            # GB/s are 1e9 bytes/s: bytes over seconds
            self.assertAlmostEqual(c["gbps"], c["bytes"] / c["seconds"] / 1e9, delta=c["gbps"] * 1e-3)
        for op in ("read", "write"):
            best = max((c for c in doc["cells"] if c["op"] == op), key=lambda c: c["gbps"])
            self.assertEqual(doc["best"][op]["gbps"], best["gbps"])
            self.assertEqual((doc["best"][op]["target"], doc["best"][op]["bs"], doc["best"][op]["qd"]),
                             (best["target"], best["bs"], best["qd"]))


class TestBench(BenchCase):
    def test_sweep_json(self) -> None:
        save = os.path.join(self.cache, "saved.json")
        doc = json.loads(self.bench("--json", "--save", save, *SMALL, *self.dirs).stdout)
        self.assertEqual((doc["bench"], doc["version"], doc["size"]), ("storage", 1, 4 << 20))
        self.assertRegex(doc["time"], r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")
        self.assertEqual([t["name"] for t in doc["targets"]], ["t0", "t1"])
        for t, d in zip(doc["targets"], self.dirs):
            self.assertEqual(t["path"], d)
            self.assertEqual(os.path.dirname(t["scratch"]), d)
            self.assertIsNone(t["link_gbps"])       # a virtual or unknown disk: no link speed
            self.assertGreater(t["prefill_gbps"], 0)
        self.check_cells(doc, ["t0", "t1", "striped"])
        self.assertEqual([p["target"] for p in doc["per_target_best"]], ["t0", "t1"])
        for p in doc["per_target_best"]:
            for op in ("read", "write"):
                self.assertEqual(p[op + "_gbps"], max(c["gbps"] for c in doc["cells"]
                                                     if c["target"] == p["target"] and c["op"] == op))
        self.assertIsNone(doc["fio"])
        self.assertIn("--no-fio", doc["fio_reason"])
        self.assertIsNone(doc["sustained"])
        self.assertIn(doc["config"]["extent_size"], BS)
        self.assertIn(doc["config"]["queue_depth"], QD)
        self.assertEqual(doc["config"]["target"], "striped")
        # saved where asked, and where tierctl plan looks
        for path in (save, os.path.join(self.cache, "tierd", "bench.json")):
            with open(path) as f:
                self.assertEqual(json.load(f), doc)
        self.assert_no_scratch()

    def test_table(self) -> None:
        out = self.bench(*SMALL, self.dirs[0]).stdout
        for s in ("t0 write, GB/s", "t0 read, GB/s", "bs \\ qd", "128K", "1M", "best read", "best write",
                  "fio         none: not run (--no-fio)", "sustained   not run", "for tierd   [nvme] extent_size"):
            self.assertIn(s, out)
        self.assertNotIn("striped", out.split("for tierd")[0])      # one target: nothing to stripe
        self.assert_no_scratch()

    def test_write_config(self) -> None:
        conf = os.path.join(self.cache, "tierd.conf")
        dropin = os.path.join(self.cache, "tierd.conf.d", "50-bench.conf")
        os.mkdir(os.path.dirname(dropin))
        os.chmod(self.dirs[1], 0o755)       # tierd refuses a target in a directory others can write
        with open(conf, "w") as f:
            f.write(f"[host]\ncapacity = 64M\nsegment_size = 16M\n[vram]\nbackend = emulated\ncapacity = 32M\n"
                    f"chunk_size = 8M\n[nvme]\ntarget = {self.dirs[1]}/t0.img:64M\n")
        doc = json.loads(self.bench("--json", "--write-config", dropin, *SMALL, self.dirs[0]).stdout)
        with open(dropin) as f:
            text = f.read()
        self.assertIn("# tierd.conf drop-in written by tierctl bench", text)
        self.assertIn(self.dirs[0], text)
        # tierd's parser and its checks, as a start would run them
        p = subprocess.run([tierd_path(), "--check-config", "-c", conf], capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        size = {128 << 10: "128K", 1 << 20: "1M"}[doc["config"]["extent_size"]]
        self.assertIn(f"extent_size = {size}\n", p.stdout)
        self.assertIn(f"queue_depth = {doc['config']['queue_depth']}\n", p.stdout)

    def test_results_path_checked_first(self) -> None:
        # tierctl(1)'s "--write-config /etc/tierd/tierd.conf.d/50-bench.conf", with no such directory: refused
        # before the sweep (which would save its results for tierctl plan first), not after it
        cached = os.path.join(self.cache, "tierd", "bench.json")
        for opt in ("--write-config", "--save"):
            missing = os.path.join(self.cache, "tierd.conf.d")
            p = self.bench(opt, os.path.join(missing, "50-bench.conf"), *SMALL, self.dirs[0], expect=1)
            self.assertIn(f"cannot write {opt} {missing}/50-bench.conf: directory {missing}: No such file or directory",
                          p.stderr)
            self.assertEqual(p.stdout, "")
            self.assertFalse(os.path.exists(cached), "the sweep ran")
            blocker = os.path.join(self.cache, "a-file")
            with open(blocker, "w"):
                pass
            p = self.bench(opt, os.path.join(blocker, "x.conf"), *SMALL, self.dirs[0], expect=1)
            self.assertIn("Not a directory", p.stderr)
            os.unlink(blocker)
            self.assertFalse(os.path.exists(cached), "the sweep ran")
        self.assert_no_scratch()

    def test_link_suspect(self) -> None:
        doc = json.loads(self.bench("--json", "--link-gbps", "0.001", *SMALL, self.dirs[0]).stdout)
        self.assertEqual(doc["targets"][0]["link_gbps"], 0.001)
        self.assertTrue(all(c["suspect"] for c in doc["cells"]))
        out = self.bench("--link-gbps", "0.001", *SMALL, self.dirs[0]).stdout
        self.assertIn("!", out)
        self.assertIn("suspect", out)
        doc = json.loads(self.bench("--json", "--link-gbps", "100000", *SMALL, self.dirs[0]).stdout)
        self.assertFalse(any(c["suspect"] for c in doc["cells"]))

    def test_bytes_per_cell(self) -> None:
        # every cell stops at its byte bound, but not before qd requests went (one queue's worth)
        args = [a for a in SMALL]
        args[args.index("--seconds-per-cell") + 1] = "60"
        doc = json.loads(self.bench("--json", "--bytes-per-cell", "1M", *args, self.dirs[0]).stdout)
        for c in doc["cells"]:
            n_io = max(-(-(1 << 20) // c["bs"]), c["qd"])
            self.assertEqual(c["bytes"], n_io * c["bs"], c)
            self.assertAlmostEqual(c["iops"], n_io / c["seconds"], delta=c["iops"] * 1e-3)

    def test_sustained(self) -> None:
        args = [a for a in SMALL]
        args[args.index("--sustain") + 1] = "16M"
        doc = json.loads(self.bench("--json", "--interval", "0.001", *args, self.dirs[0]).stdout)
        s = doc["sustained"]
        best = doc["best"]["write"]
        self.assertEqual((s["target"], s["bs"], s["qd"]), (best["target"], best["bs"], best["qd"]))
        self.assertGreaterEqual(s["bytes"], 16 << 20)
        self.assertEqual(s["interval_s"], 0.001)
        self.assertGreaterEqual(len(s["gbps"]), 1)
        self.assertEqual(s["gbps_first"], s["gbps"][0])
        self.assertIn(s["gbps_last"], s["gbps"])
        self.assertIn("cliff_at_bytes", s)
        if s["cliff_at_bytes"] is not None:
            self.assertLess(s["cliff_at_bytes"], s["bytes"])
        self.assert_no_scratch()

    def test_fio(self) -> None:
        args = [a for a in SMALL if a != "--no-fio"]
        doc = json.loads(self.bench("--json", *args, self.dirs[0]).stdout)
        if shutil.which("fio") is None:
            self.assertIsNone(doc["fio"])
            self.assertIn("fio is not installed", doc["fio_reason"])
            return
        f = doc["fio"]
        self.assertIsNotNone(f, doc.get("fio_reason"))
        self.assertGreater(f["read_gbps"], 0)
        self.assertGreater(f["write_gbps"], 0)
        self.assertEqual((f["bs"], f["qd"]), (doc["best"]["read"]["bs"], doc["best"]["read"]["qd"]))
        self.assertEqual((f["write_bs"], f["write_qd"]), (doc["best"]["write"]["bs"], doc["best"]["write"]["qd"]))
        # each op on its own best cell's files
        self.assertEqual((f["target"], f["write_target"]),
                         (doc["best"]["read"]["target"], doc["best"]["write"]["target"]))
        # a run of a few whole ms is run again with more bytes (FIO_MIN_MS 200; slack for a faster second run)
        self.assertGreaterEqual(f["runtime_ms"], 100)
        self.assertGreaterEqual(f["write_runtime_ms"], 100)
        self.assert_no_scratch()

    def test_errors(self) -> None:
        p = self.bench("--bogus", self.dirs[0], expect=2)
        self.assertIn("unknown option '--bogus'", p.stderr)
        p = self.bench("--bs", "1000", self.dirs[0], expect=2)
        self.assertIn("not a positive multiple of 4096", p.stderr)
        p = self.bench("--qd", "0", self.dirs[0], expect=2)
        self.assertIn("queue depth 0 is out of range", p.stderr)
        p = self.bench("--size", "2M", "--bs", "4M", self.dirs[0], expect=2)
        self.assertIn("larger than --size", p.stderr)
        p = self.bench("--size", "1000", self.dirs[0], expect=2)
        self.assertIn("multiple of 1M", p.stderr)
        p = self.bench("--sustain", "fast", self.dirs[0], expect=2)
        self.assertIn("--sustain 'fast'", p.stderr)
        p = self.bench("--size", expect=2)
        self.assertIn("needs an argument", p.stderr)
        # a path whose directory does not exist
        p = self.bench(*SMALL, os.path.join(self.dirs[0], "no", "such", "file"), expect=1)
        self.assertIn("cannot create", p.stderr)
        self.assertIn("No such file or directory", p.stderr)
        # the second target fails: the first one's scratch, already made, goes
        p = self.bench(*SMALL, self.dirs[0], os.path.join(self.dirs[1], "no", "file"), expect=1)
        self.assertIn("cannot create", p.stderr)
        self.assert_no_scratch()
        # an existing file is not written over without --overwrite
        victim = os.path.join(self.dirs[0], "data")
        with open(victim, "wb") as f:
            f.write(b"keep me" * 1000)
        p = self.bench(*SMALL, victim, expect=1)
        self.assertIn("--overwrite", p.stderr)
        with open(victim, "rb") as f:
            self.assertEqual(f.read(), b"keep me" * 1000)
        # with it: benched, and left in place (not ours to remove)
        self.bench("--overwrite", *SMALL, victim)
        self.assertTrue(os.path.exists(victim))
        os.unlink(victim)
        self.assert_no_scratch()

    def test_no_o_direct(self) -> None:
        # a tmpfs refuses O_DIRECT before Linux 6.6; on a newer kernel the shim makes
        # O_DIRECT opens under the directory fail the same way (EINVAL)
        shm = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
        d = tempfile.mkdtemp(prefix="tierctl-bench.", dir=shm)
        self.addCleanup(shutil.rmtree, d, True)
        if o_direct_works(d):
            shim = os.environ.get("TIER_NO_ODIRECT_SHIM")
            if not shim or not os.path.exists(shim):
                self.skipTest(f"{shm} takes O_DIRECT and no shim ($TIER_NO_ODIRECT_SHIM) to refuse it")
            preload = (os.environ.get("LD_PRELOAD", "") + " " + shim).strip()
            self.env.update(LD_PRELOAD=preload, TIER_NO_ODIRECT=d)
        p = self.bench(*SMALL, d, expect=1)
        self.assertIn("refuses O_DIRECT", p.stderr)
        self.assertIn("bench a directory on a disk filesystem", p.stderr)
        self.assertEqual(os.listdir(d), [])

    def test_memory_filesystem_refused(self) -> None:
        # a tmpfs that takes O_DIRECT (Linux 6.6 on) ran the bench and saved its figures for
        # tierctl plan, though tierd refuses targets there: memory, not a drive
        shm = "/dev/shm"
        if not os.path.isdir(shm):
            self.skipTest(f"no {shm}")
        d = tempfile.mkdtemp(prefix="tierctl-bench.", dir=shm)
        self.addCleanup(shutil.rmtree, d, True)
        if not o_direct_works(d):
            self.skipTest(f"{shm} refuses O_DIRECT here (test_no_o_direct covers it)")
        p = self.bench(*SMALL, d, expect=1)
        self.assertIn("is on a tmpfs: that is memory, not a drive", p.stderr)
        self.assertEqual(os.listdir(d), [])

    def test_sigint(self) -> None:
        # many slow cells: interrupted in the middle, the scratch file still goes
        args = ["--size", "64M", "--bs", "4K", "--qd", "1,2,4,8", "--seconds-per-cell", "2", "--sustain", "0",
                "--no-fio", self.dirs[0]]
        proc = subprocess.Popen([tierctl_path(), "bench", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=self.env)
        # tierctl blocks SIGINT and serves it from its loop before it makes the scratch file, so a
        # SIGINT sent once the file exists is never lost and always lands before the 8 s of cells end
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not any("tierctl-bench" in f for f in os.listdir(self.dirs[0])):
            time.sleep(0.01)
        self.assertTrue(any("tierctl-bench" in f for f in os.listdir(self.dirs[0])), "no scratch file in 30 s")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
        self.assertEqual(proc.returncode, 1, err)
        self.assertIn("interrupted", err)
        self.assertEqual(out, "")
        self.assert_no_scratch()

    def test_no_tierd(self) -> None:
        p = self.bench(*SMALL, socket=os.path.join(self.dirs[0], "none.sock"), expect=None)
        if os.geteuid() == 0:
            self.assertEqual(p.returncode, 1)
            self.assertIn("tierd cannot be reached", p.stderr)
        else:
            self.assertEqual(p.returncode, 1)
            self.assertIn("root or group tier-admin", p.stderr)

    def test_nobody_needs_admin(self) -> None:
        if os.geteuid() != 0:
            self.skipTest("needs root to run tierctl as uid 65534")
        try:
            subprocess.run([tierctl_path(), "--version"], capture_output=True, preexec_fn=as_nobody, check=False)
        except PermissionError:
            # a checkout under a 0700 directory (mktemp -d): the build is out of nobody's reach
            self.skipTest(f"uid 65534 cannot reach {tierctl_path()} (a parent directory is not searchable)")
        p = self.bench(*SMALL, socket=os.path.join(self.dirs[0], "none.sock"), expect=None, nobody=True)
        if p.returncode == 127 or "error while loading" in p.stderr:
            self.skipTest("uid 65534 cannot run this build's tierctl (a 0700 directory above it?)")
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn("needs root or group tier-admin", p.stderr)
        # a PATH of its own is fine
        self.env["XDG_CACHE_HOME"] = self.dirs[1]
        self.bench(*SMALL, self.dirs[0], nobody=True)
        self.assert_no_scratch()


class TestBenchTierd(tierd.DaemonTestCase, BenchCase):
    """Against a running tierd: a scratch next to its target, the target untouched."""

    def setUp(self) -> None:
        BenchCase.setUp(self)
        if os.geteuid() != 0:
            self.skipTest("benching tierd's targets needs root or group tier-admin")

    def test_targets(self) -> None:
        target = os.path.join(self.d.dir, "t0.img")
        before = sha256(target)
        doc = json.loads(self.bench("--json", *SMALL, socket=self.socket).stdout)
        self.assertEqual(len(doc["targets"]), 1)
        t = doc["targets"][0]
        self.assertEqual(t["path"], target)
        self.assertNotEqual(t["scratch"], target)
        self.assertEqual(os.path.dirname(t["scratch"]), self.d.dir)     # same directory, same filesystem
        self.assertFalse(os.path.exists(t["scratch"]), "the scratch file is removed")
        self.assertEqual([f for f in os.listdir(self.d.dir) if "tierctl-bench" in f], [])
        self.check_cells(doc, ["t0"])
        self.assertEqual(sha256(target), before, "the target's data is untouched")
        # tierd still serves, and never saw its target written by anyone else
        st = subprocess.run([tierctl_path(), "--socket", self.socket, "status", "--json"], capture_output=True,
                            text=True, timeout=60)
        self.assertEqual(st.returncode, 0, st.stderr)
        ts = json.loads(st.stdout)["targets"][0]
        self.assertEqual((ts["io_errors"], ts["crc_errors"]), (0, 0))


class TestBenchTierdBlockdev(BenchCase):
    """A tierd whose target is a block device (a loop device): no room for a scratch beside it."""

    def test_refused(self) -> None:
        if os.geteuid() != 0:
            self.skipTest("needs root (losetup, and benching tierd's targets)")
        why = tierd.can_lock_memory(tierd.HOST_CAPACITY)
        if why:
            self.skipTest(why)
        if shutil.which("losetup") is None:
            self.skipTest("no losetup (util-linux)")
        img = os.path.join(self.dirs[1], "disk.img")
        with open(img, "wb") as f:
            f.truncate(64 << 20)
        p = subprocess.run(["losetup", "--find", "--show", img], capture_output=True, text=True, timeout=60)
        if p.returncode != 0:
            self.skipTest(f"no loop device here: {p.stderr.strip()}")
        loop = p.stdout.strip()
        self.addCleanup(subprocess.run, ["losetup", "-d", loop], timeout=60)
        config = tierd.CONFIG.replace("target = @DIR@/t0.img:256M", f"target = {loop}")
        with tierd.Tierd(config) as d:
            before = sha256(loop)
            p = self.bench(*SMALL, socket=d.socket, expect=1)
            self.assertIn(f"tierd's target '{loop}' is a block device", p.stderr)
            self.assertIn("give a scratch PATH", p.stderr)
            self.assertEqual(sha256(loop), before)


if __name__ == "__main__":
    tierd.main()
