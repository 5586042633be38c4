# SPDX-License-Identifier: MIT
"""Hostile files and hostile names: what a careless admin or a hostile user leaves where tierd reads.

* NVMe targets: a sparse file made with truncate(1) is allocated whole at start;
  a FIFO is refused without hanging the start; a target on tmpfs is refused in
  words, and a file tierd made for a refused target is removed again; one in
  a directory others can write (or reached by a link into one) is refused,
  before the capacity check follows a link planted there.
* Names with a NUL inside or not UTF-8 are refused (ValueError) before they reach
  tierd, which refuses them too (tests/integration/test-garbage.c sends them raw).
* State files: a FIFO or a symbolic link as STATE_DIR/quotas or STATE_DIR/wear
  does not hang the start: each is set aside (NAME.corrupt.TIMESTAMP) and said
  in the log.  A state directory that users other than tierd's can write is
  refused (exit 6), by --check-config too, before anything in it is made.
  Temporary files a killed tierd left there (quotas.XXXXXX), or next to the
  [metrics] textfile (NAME.prom.XXXXXX), are removed at start, and nothing else.
* The socket file is made 0660 by bind() (whatever the umask), never chmod()ed
  by its path: a link put there after bind() leads nowhere.
"""

from __future__ import annotations

import glob
import os
import shutil
import stat
import struct
import subprocess
import sys
import tempfile
import time
import unittest
import unittest.mock

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tierd import CONFIG, MiB, Tierd, main  # noqa: E402

import tier  # noqa: E402


def _start_fails(d: Tierd, timeout: float = 20.0, status: int | None = None) -> str:
    """Start @d, which must exit (not hang, not come up) within @timeout s, with @status if given; its log."""
    t0 = time.monotonic()
    with open(os.devnull, "w") as null:
        old = sys.stderr
        sys.stderr = null  # Tierd.start prints the log on failure: the test reads it instead
        try:
            d.start(timeout=timeout)
        except RuntimeError as e:
            if "exited" not in str(e):
                raise
            if status is not None and f"(status {status})" not in str(e):
                raise AssertionError(f"{e}, not status {status}") from e
        else:
            raise AssertionError("tierd started")
        finally:
            sys.stderr = old
    assert time.monotonic() - t0 < timeout
    return d.log_text()


class Targets(unittest.TestCase):
    def test_sparse_target_allocated(self) -> None:
        d = Tierd()
        path = os.path.join(d.dir, "t0.img")
        with open(path, "wb") as f:
            f.truncate(256 * MiB)  # what `truncate -s 256M t0.img` leaves: no blocks
        self.assertLess(os.stat(path).st_blocks * 512, MiB)
        with d:
            self.assertGreaterEqual(os.stat(path).st_blocks * 512, 256 * MiB)
            c = tier.Client("sparse", socket=d.socket)
            t = c.create("x", 4 * MiB)
            t.evict(tier.NVME)
            c.close()

    def test_sparse_target_beyond_free_space_refused(self) -> None:
        d = Tierd(CONFIG.replace("@DIR@/t0.img:256M", "@DIR@/t0.img"))
        self.addCleanup(d.cleanup)
        path = os.path.join(d.dir, "t0.img")
        vfs = os.statvfs(d.dir)
        size = vfs.f_bavail * vfs.f_frsize + (64 << 30)
        try:
            with open(path, "wb") as f:
                f.truncate(size)  # sparse: more than the filesystem could ever back
        except OSError as e:
            self.skipTest(f"cannot make a sparse file of {size} bytes here: {e}")
        log = _start_fails(d)
        self.assertIn("is more than the filesystem can back", log)
        self.assertIn("tierd allocates a target whole (a sparse file too)", log)
        self.assertLess(os.stat(path).st_blocks * 512, MiB)  # refused before anything was allocated

    def test_fifo_target_refused(self) -> None:
        d = Tierd()
        self.addCleanup(d.cleanup)
        os.mkfifo(os.path.join(d.dir, "t0.img"))
        log = _start_fails(d)
        self.assertIn("is neither a regular file nor a block device", log)

    def test_tmpfs_target_refused(self) -> None:
        shm = "/dev/shm"
        if not os.path.isdir(shm) or os.statvfs(shm).f_bsize == 0:
            self.skipTest("no /dev/shm")
        with open("/proc/self/mounts") as f:
            if not any(line.split()[1] == shm and line.split()[2] == "tmpfs" for line in f):
                self.skipTest("/dev/shm is not a tmpfs here")
        # a directory of its own there: /dev/shm itself (1777) is refused before the file system is looked at
        private = tempfile.mkdtemp(prefix="tierd-test.", dir=shm)
        self.addCleanup(shutil.rmtree, private, True)
        target = os.path.join(private, "t0.img")
        d = Tierd(CONFIG.replace("@DIR@/t0.img", target))
        self.addCleanup(d.cleanup)
        log = _start_fails(d)
        self.assertIn("is on a tmpfs: that is memory, not a drive", log)
        self.assertFalse(os.path.exists(target), "the file tierd made for a refused target is still there")


    def test_target_in_a_directory_others_can_write_refused(self) -> None:
        """An absolute target in a directory any user can write, or a link leading there from the state
        directory, is refused (exit 6, --check-config too) before anything is made there: anyone could
        plant a link by that name and have root's tierd create, truncate and write a file of root's.
        Made 0755, the same directory is taken, through the link too (a link in a trusted directory is
        its owner's, as /dev/disk/by-id's are)."""
        tierd_bin = os.path.join(os.environ.get("TIER_BUILD", "build"), "daemon", "tierd")
        for target in ("@DIR@/open/t0.img:256M", "@DIR@/link.img:256M"):
            d = Tierd(CONFIG.replace("@DIR@/t0.img:256M", target))
            self.addCleanup(d.cleanup)
            open_dir = os.path.join(d.dir, "open")
            os.mkdir(open_dir)
            os.chmod(open_dir, 0o777)
            os.symlink("open/t0.img", os.path.join(d.dir, "link.img"))
            path = target.replace("@DIR@", d.dir)[:-len(":256M")]
            p = subprocess.run([tierd_bin, "--check-config", "--config", d.config, "--state-dir", d.dir,
                                "--socket", d.socket], capture_output=True, text=True, timeout=60)
            self.assertEqual(p.returncode, 6, p.stderr)
            why = f'Refusing NVMe target {path}: the directory "{open_dir}" holding "t0.img"'
            self.assertIn(why, p.stderr)
            self.assertIn("is not trusted: it is writable by every user", p.stderr)
            log = _start_fails(d, status=6)
            self.assertIn(why, log)
            self.assertEqual(os.listdir(open_dir), [])
            os.chmod(open_dir, 0o755)
            with d:
                tier.Client("after", socket=d.socket).close()
                self.assertEqual(os.stat(os.path.join(open_dir, "t0.img")).st_size, 256 * MiB)
                self.assertTrue(os.path.islink(os.path.join(d.dir, "link.img")))

    def test_link_in_untrusted_directory_refused_before_capacity(self) -> None:
        """A link planted in a directory any user can write is refused as untrusted before anything follows it:
        --check-config ran the capacity check first, which stat()ed (and, for a device, opened) the target by
        its path, through the link, and said the capacity of the file it leads to (here too big to back)."""
        tierd_bin = os.path.join(os.environ.get("TIER_BUILD", "build"), "daemon", "tierd")
        d = Tierd(CONFIG.replace("@DIR@/t0.img:256M", "@DIR@/open/t0.img"))  # its own size: the file's
        self.addCleanup(d.cleanup)
        open_dir = os.path.join(d.dir, "open")
        os.mkdir(open_dir)
        os.chmod(open_dir, 0o777)
        victim = os.path.join(d.dir, "victim.img")
        vfs = os.statvfs(d.dir)
        size = vfs.f_bavail * vfs.f_frsize + (64 << 30)
        try:
            with open(victim, "wb") as f:
                f.truncate(size)  # another size than any target could be: the capacity check refuses it
        except OSError as e:
            self.skipTest(f"cannot make a sparse file of {size} bytes here: {e}")
        os.symlink(victim, os.path.join(open_dir, "t0.img"))
        path = os.path.join(open_dir, "t0.img")
        why = f'Refusing NVMe target {path}: the directory "{open_dir}" holding "t0.img" is not trusted'
        p = subprocess.run([tierd_bin, "--check-config", "--config", d.config, "--state-dir", d.dir,
                            "--socket", d.socket], capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 6, p.stderr)
        self.assertIn(why, p.stderr)
        self.assertNotIn("filesystem", p.stderr)
        log = _start_fails(d, status=6)
        self.assertIn(why, log)
        self.assertNotIn("filesystem", log)
        self.assertEqual(os.stat(victim).st_size, size)
        self.assertLess(os.stat(victim).st_blocks * 512, MiB)


class Names(unittest.TestCase):
    def test_not_text_refused_before_tierd(self) -> None:
        with Tierd() as d:
            for bad in ("bad\x00name", "caf\udce9", "\udcff"):
                with self.assertRaises(ValueError):
                    tier.Client(bad, socket=d.socket)
            c = tier.Client("names", socket=d.socket)
            for bad in ("bad\x00name", "caf\udce9"):
                with self.assertRaises(ValueError):
                    c.create(bad, 4096)
            c.create("bad", 4096).destroy()  # not made by the refused "bad\0name"
            c.create("café 😀", 4096).destroy()
            c.close()


class Totals(unittest.TestCase):
    def test_uid_total_from_python(self) -> None:
        if os.geteuid() != 0:
            self.skipTest("setting a total needs root or tier-admin")
        with Tierd(CONFIG.replace("job_limit = 48M\n", "job_limit = 48M\nuid_share = 50\n")) as d:
            c = tier.Client("totals", socket=d.socket)
            q = c.get_quota_total(uid=65534)
            self.assertEqual(q.totals["host"], 32 * MiB)  # uid_share 50 of the 64M pool
            self.assertEqual(q.sources["host"], "uid_share")
            self.assertEqual(c.get_quota_total(uid=0).sources["host"], "none")  # root: no share
            q = c.set_quota_total(uid=0, host=8 * MiB)
            self.assertEqual(q.totals[tier.HOST], 8 * MiB)
            self.assertEqual(q.sources["host"], "uid 0")
            ts = [c.create(f"t{i}", 4 * MiB) for i in range(3)]
            ts[0].pin(tier.HOST, tier.WRITE)
            ts[1].pin(tier.HOST, tier.WRITE)
            with self.assertRaises(tier.QuotaError) as e:
                ts[2].pin(tier.HOST, tier.WRITE)
            self.assertIn("uid 0 is at its host total", str(e.exception))
            self.assertEqual(c.get_quota_total(uid=0).used["host"], 8 * MiB)
            c.set_quota_total(uid=0, host=0)
            ts[2].pin(tier.HOST, tier.WRITE)
            with self.assertRaises(ValueError):
                c.set_quota_total(uid=0)
            c.close()


class StateFiles(unittest.TestCase):
    def test_fifo_and_link_state_files(self) -> None:
        d = Tierd()
        self.addCleanup(d.cleanup)
        os.mkfifo(os.path.join(d.dir, "quotas"))
        os.symlink("/etc/passwd", os.path.join(d.dir, "wear"))
        with d:
            c = tier.Client("after", socket=d.socket)
            c.close()
            log = d.log_text()
            self.assertIn("not a regular file", log)
            quotas = glob.glob(os.path.join(d.dir, "quotas.corrupt.*"))
            wear = glob.glob(os.path.join(d.dir, "wear.corrupt.*"))
            self.assertEqual(len(quotas), 1, os.listdir(d.dir))
            self.assertEqual(len(wear), 1, os.listdir(d.dir))
            self.assertTrue(stat.S_ISFIFO(os.lstat(quotas[0]).st_mode))
            self.assertTrue(os.path.islink(wear[0]))
            self.assertFalse(os.path.exists(os.path.join(d.dir, "quotas")))

    def test_temporary_files_of_a_killed_write_removed(self) -> None:
        """What a tierd killed between making a state file's temporary copy (mkostemp's QUOTAS.XXXXXX)
        and renaming it left is removed at the next start, and said in the log; nothing else is: not
        another length of suffix, another base name, a link or a directory of that name, another
        user's file."""
        d = Tierd()
        self.addCleanup(d.cleanup)
        gone = ["quotas.Ab3xYz", "wear.000000", "wear.q1W2e3"]
        stay = ["quotas.Ab3xY", "quotas.Ab3xYz7", "quotas.Ab-xYz", "wearx.Ab3xYz", "xwear.Ab3xYz",
                "nvme-index.0.Ab3xYz", "t0.img.Ab3xYz", "wear.corrupt.20260101T000000Z"]
        for name in gone + stay:
            with open(os.path.join(d.dir, name), "w") as f:
                f.write("half a state file\n")
        canary = os.path.join(d.dir, "canary")
        with open(canary, "w") as f:
            f.write("root's\n")
        os.symlink(canary, os.path.join(d.dir, "quotas.LnK123"))
        os.mkdir(os.path.join(d.dir, "wear.DiR123"))
        stay += ["canary", "quotas.LnK123", "wear.DiR123"]
        if os.geteuid() == 0:
            os.chown(os.path.join(d.dir, "quotas.Ab3xYz"), 1234, 1234)  # not tierd's: stays
            gone.remove("quotas.Ab3xYz")
            stay.append("quotas.Ab3xYz")
        with d:
            tier.Client("after", socket=d.socket).close()
            names = set(os.listdir(d.dir))
            log = d.log_text()
            with open(canary) as f:
                self.assertEqual(f.read(), "root's\n")
        for name in gone:
            self.assertNotIn(name, names)
            self.assertIn(f'Removed "{d.dir}/{name}", a temporary file left by a tierd stopped', log)
        for name in stay:
            self.assertIn(name, names)
            self.assertNotIn(f'Removed "{d.dir}/{name}"', log)

    @unittest.skipIf("libasan" in os.environ.get("LD_PRELOAD", ""), "the shim is preloaded without ASan's runtime")
    def test_state_files_written_under_the_lock(self) -> None:
        """Every state file is renamed into place while tierd holds the state directory's lock, the last
        one at stop too (tests/helpers/lock-probe.c asks at each rename()): the lock was let go before
        the manager was freed, and its final wear save came after, where a second tierd on the directory
        could already have taken the lock and removed the temporary file being written."""
        shim = os.environ.get("TIER_LOCK_PROBE_SHIM") or os.path.join(
            os.environ.get("TIER_BUILD", "build"), "tests", "liblock-probe.so")
        self.assertTrue(os.path.exists(shim), shim)
        d = Tierd()
        self.addCleanup(d.cleanup)
        probe_log = os.path.join(d.dir, "probe.log")
        with unittest.mock.patch.dict(os.environ, {"LD_PRELOAD": shim, "TIER_LOCK_PROBE": d.dir,
                                                   "TIER_LOCK_PROBE_LOG": probe_log}):
            d.start()
        tier.Client("after", socket=d.socket).close()
        self.assertEqual(d.stop(), 0)
        with open(probe_log) as f:
            lines = f.read().splitlines()
        self.assertIn(f"locked {d.dir}/wear", lines)        # the save at stop, at least
        self.assertEqual([line for line in lines if not line.startswith("locked ")], [])

    def test_temporary_metrics_files_of_a_killed_write_removed(self) -> None:
        """[metrics] textfile is written as the state files are (NAME.prom.XXXXXX, then a rename): what a
        tierd killed between the two left in the collector's directory is removed at the next start, and
        said in the log; nothing else is (as for the state directory's temporary files)."""
        d = Tierd(CONFIG + "[metrics]\ntextfile = @DIR@/prom/tierd.prom\ninterval_sec = 3600\n")
        self.addCleanup(d.cleanup)
        prom = os.path.join(d.dir, "prom")
        os.mkdir(prom)
        gone = ["tierd.prom.Ab3xYz", "tierd.prom.000000"]
        stay = ["tierd.prom.Ab3xY", "tierd.prom.Ab3xYz7", "tierd.prom.Ab-xYz", "tierd.promx.Ab3xYz",
                "xtierd.prom.Ab3xYz", "other.prom.Ab3xYz", "quotas.Ab3xYz", "tierd.prom.corrupt.20260101T000000Z"]
        for name in gone + stay:
            with open(os.path.join(prom, name), "w") as f:
                f.write("half a metrics file\n")
        canary = os.path.join(d.dir, "canary")
        with open(canary, "w") as f:
            f.write("root's\n")
        os.symlink(canary, os.path.join(prom, "tierd.prom.LnK123"))
        os.mkdir(os.path.join(prom, "tierd.prom.DiR123"))
        stay += ["tierd.prom.LnK123", "tierd.prom.DiR123"]
        if os.geteuid() == 0:
            os.chown(os.path.join(prom, "tierd.prom.Ab3xYz"), 1234, 1234)  # not tierd's: stays
            gone.remove("tierd.prom.Ab3xYz")
            stay.append("tierd.prom.Ab3xYz")
        with d:
            tier.Client("after", socket=d.socket).close()
            names = set(os.listdir(prom))
            log = d.log_text()
            with open(canary) as f:
                self.assertEqual(f.read(), "root's\n")
        for name in gone:
            self.assertNotIn(name, names)
            self.assertIn(f'Removed "{prom}/{name}", a temporary file left by a tierd stopped', log)
        for name in stay:
            self.assertIn(name, names)
            self.assertNotIn(f'Removed "{prom}/{name}"', log)

    def test_state_dir_acl_lets_another_write_refused(self) -> None:
        """A state directory whose POSIX ACL lets another user write it (0770 root:root with
        user:1234:rwx: the mode's group bits are the ACL's mask) is refused as one of mode 0777 is."""
        tierd_bin = os.path.join(os.environ.get("TIER_BUILD", "build"), "daemon", "tierd")
        d = Tierd()
        self.addCleanup(d.cleanup)
        os.chmod(d.dir, 0o770)
        # user::rwx user:1234:rwx group::r-x mask::rwx other::--- (setfacl is not installed here)
        entries = [(0x01, 7, 0xffffffff), (0x02, 7, 1234), (0x04, 5, 0xffffffff), (0x10, 7, 0xffffffff),
                   (0x20, 0, 0xffffffff)]
        acl = struct.pack("<I", 2) + b"".join(struct.pack("<HHI", *e) for e in entries)
        try:
            os.setxattr(d.dir, "system.posix_acl_access", acl)
        except OSError as e:
            self.skipTest(f"no POSIX ACLs on {d.dir}'s file system: {e}")
        p = subprocess.run([tierd_bin, "--check-config", "--config", d.config, "--state-dir", d.dir,
                            "--socket", d.socket], capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 6, p.stderr)
        self.assertIn("POSIX ACL lets user 1234 write it", p.stderr)
        log = _start_fails(d)
        self.assertIn("POSIX ACL lets user 1234 write it", log)
        os.removexattr(d.dir, "system.posix_acl_access")
        os.chmod(d.dir, 0o700)
        with d:
            tier.Client("after", socket=d.socket).close()

    def test_state_dir_others_can_write_refused(self) -> None:
        """A state directory any user can write (sticky or not) is refused before anything in it is
        made or read: a planted link there would aim tierd's writes at a file of root's."""
        tierd_bin = os.path.join(os.environ.get("TIER_BUILD", "build"), "daemon", "tierd")
        for mode in (0o777, 0o1777):
            d = Tierd()
            self.addCleanup(d.cleanup)
            os.chmod(d.dir, mode)
            before = sorted(os.listdir(d.dir))
            p = subprocess.run([tierd_bin, "--check-config", "--config", d.config, "--state-dir", d.dir,
                                "--socket", d.socket], capture_output=True, text=True, timeout=60)
            self.assertEqual(p.returncode, 6, p.stderr)
            self.assertIn("Refusing the state directory", p.stderr)
            log = _start_fails(d)
            self.assertIn("Refusing the state directory", log)
            self.assertIn("writable by every user", log)
            after = [n for n in sorted(os.listdir(d.dir)) if n != "tierd.log"]
            self.assertEqual(after, [n for n in before if n != "tierd.log"])   # no target, no index
            os.chmod(d.dir, 0o700)      # the same directory, as tierd makes it: it starts
            with d:
                tier.Client("after", socket=d.socket).close()

    @unittest.skipIf(os.geteuid() != 0, "needs root to run tierd --check-config as uid 65534")
    def test_state_dir_refused_for_a_user_says_for_whom(self) -> None:
        """A directory root's tierd (the service) takes, 0775 root:root, is refused to a tierd of
        another user (its group may write it): --check-config run by that user says for which user
        it judged, and that run as root tierd would accept it, not only that the group is wrong."""
        tierd_bin = os.path.join(os.environ.get("TIER_BUILD", "build"), "daemon", "tierd")
        d = Tierd()
        self.addCleanup(d.cleanup)
        os.chmod(d.dir, 0o775)
        os.chmod(d.config, 0o644)
        args = [tierd_bin, "--check-config", "--config", d.config, "--state-dir", d.dir, "--socket", d.socket]
        # as scripts/test's nonroot pass runs tierd: uid 65534 keeping CAP_IPC_LOCK (the host pool's lock)
        nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all,+ipc_lock",
                  "--ambient-caps=-all,+ipc_lock", "--bounding-set=-all,+ipc_lock", "--"]
        if not shutil.which("setpriv"):
            self.skipTest("no setpriv (util-linux)")
        p = subprocess.run(nobody + [tierd_bin, "--version"], capture_output=True, check=False)
        if p.returncode != 0:
            self.skipTest(f"uid 65534 cannot run {tierd_bin} (a 0700 directory above it?)")
        p = subprocess.run(args, capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)     # root's tierd: group root is its own
        p = subprocess.run(nobody + args, capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 6, p.stderr)
        self.assertIn("writable by group 0, not tierd's (gid 65534", p.stderr)
        self.assertIn("for a tierd run as uid 65534, gid 65534, as this one is", p.stderr)
        self.assertIn("Run as root (as tierd.service runs it), tierd would accept it", p.stderr)


class Socket(unittest.TestCase):
    @unittest.skipIf("libasan" in os.environ.get("LD_PRELOAD", ""), "the shim is preloaded without ASan's runtime")
    def test_bound_socket_swapped_for_a_link(self) -> None:
        """A link put where bind() made the socket file (tests/helpers/bind-swap.c, at exactly that
        point) does not lead tierd to change the mode of the file it names: the socket gets its mode
        when it is made, not by its path after."""
        shim = os.environ.get("TIER_BIND_SWAP_SHIM") or os.path.join(
            os.environ.get("TIER_BUILD", "build"), "tests", "libbind-swap.so")
        if not os.path.exists(shim):
            self.skipTest(f"no {shim}")
        d = Tierd()
        self.addCleanup(d.cleanup)
        canary = os.path.join(d.dir, "canary")
        with open(canary, "w") as f:
            f.write("root's\n")
        os.chmod(canary, 0o600)
        with unittest.mock.patch.dict(os.environ, {"LD_PRELOAD": shim, "TIER_BIND_SWAP": canary}):
            d.start()
        try:
            self.assertTrue(os.path.islink(d.socket))       # the shim did swap it
            self.assertEqual(stat.S_IMODE(os.stat(canary).st_mode), 0o600)
        finally:
            d.stop()

    def test_socket_mode_whatever_the_umask(self) -> None:
        """The socket file is 0660 whatever umask tierd was started with."""
        for mask in (0o000, 0o077):
            d = Tierd()
            self.addCleanup(d.cleanup)
            old = os.umask(mask)
            try:
                d.start()
            finally:
                os.umask(old)
            try:
                self.assertEqual(stat.S_IMODE(os.lstat(d.socket).st_mode), 0o660, oct(mask))
            finally:
                d.stop()


class Connections(unittest.TestCase):
    def test_idle_connections_and_running_out_of_fds(self) -> None:
        """A uid's connections count against max_connections_per_uid before their Hello too (idle ones
        kept everyone else out once max_connections was reached); and when tierd runs out of fds, accept()
        rests instead of spinning: the warning comes once, and tierd serves again once fds free (it used
        to log the failure thousands of times a second at full CPU)."""
        import resource
        import socket

        config = CONFIG.replace("[daemon]\n", "[daemon]\nmax_connections_per_uid = 4\n")
        with Tierd(config, log_level="info") as d:
            assert d.proc is not None
            idle = []
            for _ in range(4):
                s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
                s.connect(d.socket)
                idle.append(s)
            extra = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
            extra.connect(d.socket)
            extra.settimeout(20)
            self.assertGreater(len(extra.recv(4096)), 0)   # why (test_refused_client_is_told_why)
            self.assertEqual(extra.recv(16), b"")       # closed by tierd, not left waiting for its Hello
            extra.close()
            self.assertIn("uid 0 has 4 connections (max_connections_per_uid)", d.log_text())
            for s in idle:
                s.close()

        with Tierd(CONFIG, log_level="info") as d:
            assert d.proc is not None
            # no fd above the highest one open now (those below it that are free fill first)
            n = max(int(f) for f in os.listdir(f"/proc/{d.proc.pid}/fd")) + 1
            old = resource.prlimit(d.proc.pid, resource.RLIMIT_NOFILE)
            resource.prlimit(d.proc.pid, resource.RLIMIT_NOFILE, (n, old[1]))
            waiting = []
            try:
                for _ in range(n + 1):
                    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
                    s.connect(d.socket)
                    waiting.append(s)
                for _ in range(2000):
                    if "out of file descriptors" in d.log_text():
                        break
                    time.sleep(0.01)
                time.sleep(0.3)         # (the old code logged thousands of times meanwhile)
                self.assertEqual(d.log_text().count("accept() failed"), 1)
            finally:
                for s in waiting:
                    s.close()
                resource.prlimit(d.proc.pid, resource.RLIMIT_NOFILE, old)
            c = tier.Client("after", socket=d.socket)
            c.create("t", 1 * MiB).destroy()
            c.close()

    def test_refused_client_is_told_why(self) -> None:
        """A connection refused at accept (max_connections_per_uid, max_connections) was closed without a
        word: the client saw "tierd closed the connection" and only tierd's log said why.  tierd now sends
        the error reply its Hello would get first: the client fails with EUSERS and the reason."""
        import errno
        import socket
        import subprocess

        ctl = [os.path.join(os.environ["TIER_BUILD"], "client", "tierctl")]
        for key, words in (("max_connections_per_uid", "uid 0 has 2 connections, as many as [daemon] "
                                                       "max_connections_per_uid allows"),
                           ("max_connections", "it has 2 connections, as many as [daemon] max_connections "
                                               "allows")):
            with self.subTest(key=key), Tierd(CONFIG.replace("[daemon]\n", f"[daemon]\n{key} = 2\n"),
                                               log_level="info") as d:
                idle = []
                for _ in range(2):
                    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
                    s.connect(d.socket)
                    idle.append(s)
                try:
                    with self.assertRaises(tier.TierError) as cm:
                        tier.Client("refused", socket=d.socket)
                    self.assertEqual(cm.exception.errno, errno.EUSERS)
                    self.assertIn(words, str(cm.exception))
                    p = subprocess.run(ctl + ["--socket", d.socket, "status"], capture_output=True, text=True,
                                       timeout=60)
                    self.assertEqual(p.returncode, 1, p.stderr)
                    self.assertIn(words, p.stderr)
                finally:
                    for s in idle:
                        s.close()


if __name__ == "__main__":
    main()
