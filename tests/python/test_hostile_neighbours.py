# SPDX-License-Identifier: MIT
"""Hostile neighbours on one tierd: what one uid may make tierd keep, and what another uid sees.

* Tensors are bounded per uid ([limits] max_tensors_per_uid), over all the jobs of the uid,
  lingering ones included: a tensor with no copy costs no quota, yet tierd keeps its record and
  writes it to the NVMe index, and max_tensors bounded only each job, of which one uid may have
  max_connections_per_uid (64): some 4 million tensors, 5 GiB of tierd's memory.
* A job name is the first Hello's: another uid that wants it is refused (EACCES) in words that
  name the owner and say what to do instead (another name, or the owner or an admin ends it).
* A job name whose [quota] rule names an owner is that uid's alone: uid 65534 named a job "nightly"
  first and took the max and the guarantee tierd.conf meant for another user's nightly job (and held
  the name against it); now any other uid's Hello is refused before the job exists, and tierd warns
  of a job-name rule without an owner that gives a guarantee.
* The parts that act as a second uid (65534) need root (setresuid) and skip otherwise.
"""

from __future__ import annotations

import errno
import json
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tierd import CONFIG, Tierd, main  # noqa: E402

import tier  # noqa: E402

NOBODY = 65534


def as_uid(uid: int, fn) -> dict:
    """Run @fn() in a child as @uid (and gid) with no supplementary groups; what it returned (a dict)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            os.close(r)
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            out = fn()
        except BaseException as e:  # noqa: BLE001 (said to the parent)
            out = {"exception": repr(e)}
            code = 1
        os.write(w, json.dumps(out).encode())
        os._exit(code)
    os.close(w)
    data = b""
    while chunk := os.read(r, 65536):
        data += chunk
    os.close(r)
    os.waitpid(pid, 0)
    return json.loads(data)


def fill(sock: str, job: str, n: int) -> dict:
    """Create up to @n tensors in @job (one client, kept open by the caller's process); how many, and the refusal."""
    c = tier.Client(job, socket=sock)
    made = 0
    for i in range(n):
        try:
            c.create(f"t{i}", 4096)
        except tier.TierError as e:
            return {"made": made, "errno": e.errno, "error": e.strerror, "client": c}
        made += 1
    return {"made": made, "errno": 0, "error": "", "client": c}


class TensorsPerUid(unittest.TestCase):
    def setUp(self) -> None:
        cfg = CONFIG.replace("max_inflight = 64", "max_inflight = 64\nmax_tensors = 64\nmax_tensors_per_uid = 100")
        self.d = Tierd(cfg.replace("linger_sec = 0", "linger_sec = 600"))
        self.addCleanup(self.d.cleanup)
        self.d.start()

    def test_tensors_bounded_over_a_uids_jobs(self) -> None:
        """Two jobs of one uid hold 100 tensors at most together, a lingering one's counting; the
        refusal says the key and what to do; freeing one, or ending a job, makes room again."""
        a = fill(self.d.socket, "first", 64)
        self.assertEqual((a["made"], a["errno"]), (64, 0))
        a["client"].close()                 # "first" lingers, its 64 tensors kept: they count
        b = fill(self.d.socket, "second", 64)
        self.assertEqual((b["made"], b["errno"]), (36, errno.EMFILE), b["error"])
        self.assertIn(f"uid {os.getuid()} has 100 tensors in its jobs (lingering ones included), [limits] "
                      "max_tensors_per_uid (100): free some, or end a job it no longer needs (tierctl detach JOB)",
                      b["error"])
        c = b["client"]
        c.open("t0").destroy()              # room for one again
        c.create("again", 4096)
        with self.assertRaises(tier.TierError) as cm:
            c.create("one-more", 4096)
        self.assertEqual(cm.exception.errno, errno.EMFILE)
        c.close()
        self.assertEqual(self.d.stop(), 0)

    def test_existing_name_at_the_bound_is_eexist(self) -> None:
        """At a bound (the uid's, or the job's max_tensors) a create of a name the job has is EEXIST, not EMFILE:
        Client.tensor()'s create-or-open, where another rank created the name between its open and its create,
        takes EEXIST to open it; it was refused EMFILE with the uid at its bound (found by review)."""
        a = fill(self.d.socket, "full", 64)                 # the job at max_tensors (64)
        self.assertEqual((a["made"], a["errno"]), (64, 0))
        b = fill(self.d.socket, "rest", 64)                 # the uid at max_tensors_per_uid (100)
        self.assertEqual((b["made"], b["errno"]), (36, errno.EMFILE), b["error"])
        for c in (a["client"], b["client"]):
            with self.subTest(job=c.job), self.assertRaises(tier.TierError) as cm:
                c.create("t0", 4096)
            self.assertEqual(cm.exception.errno, errno.EEXIST, cm.exception.strerror)
            self.assertIn("tensor 't0' already exists in job", cm.exception.strerror)
        with self.assertRaises(tier.TierError) as cm:
            b["client"].create("new", 4096)                 # a new name: still the uid's bound
        self.assertEqual(cm.exception.errno, errno.EMFILE)
        a["client"].close()
        b["client"].close()
        self.assertEqual(self.d.stop(), 0)

    @unittest.skipIf(os.geteuid() != 0, "acting as another uid needs root")
    def test_another_uid_has_its_own(self) -> None:
        """One uid at its bound takes nothing from another's: uid 65534 still makes its 100."""
        os.chmod(self.d.dir, 0o711)
        os.chmod(self.d.socket, 0o666)
        a = fill(self.d.socket, "mine", 64)
        b = fill(self.d.socket, "mine-too", 64)
        self.assertEqual((a["made"] + b["made"], b["errno"]), (100, errno.EMFILE))
        sock = self.d.socket

        def other() -> dict:
            x = fill(sock, "nobodys", 64)
            y = fill(sock, "nobodys-too", 64)
            return {"made": x["made"] + y["made"], "errno": y["errno"], "error": y["error"]}

        got = as_uid(NOBODY, other)
        self.assertEqual((got.get("made"), got.get("errno")), (100, errno.EMFILE), got)
        self.assertIn(f"uid {NOBODY} has 100 tensors in its jobs", got["error"])
        a["client"].close()
        b["client"].close()
        self.assertEqual(self.d.stop(), 0)

    @unittest.skipIf(os.geteuid() != 0, "acting as another uid needs root")
    def test_admin_in_another_uids_job_counts_for_its_owner(self) -> None:
        """Root (an admin) attached to uid 65534's job: what it creates there is that uid's, held to its bound.
        It was counted for root's own jobs, so root put uid 65534 over its bound, and, at its own bound, could
        create nothing in another uid's job with room (found by review)."""
        os.chmod(self.d.dir, 0o711)
        os.chmod(self.d.socket, 0o666)
        sock = self.d.socket

        def other() -> dict:
            x = fill(sock, "nb-1", 64)
            y = fill(sock, "nb-2", 64)
            return {"made": x["made"] + y["made"], "errno": y["errno"]}

        got = as_uid(NOBODY, other)                         # its jobs linger (linger_sec = 600), 100 tensors
        self.assertEqual((got.get("made"), got.get("errno")), (100, errno.EMFILE), got)
        c = tier.Client("nb-2", socket=sock)                # root attaches to uid 65534's job
        with self.assertRaises(tier.TierError) as cm:
            c.create("by-root", 4096)
        self.assertEqual(cm.exception.errno, errno.EMFILE, cm.exception.strerror)
        self.assertIn(f"uid {NOBODY} has 100 tensors in its jobs", cm.exception.strerror)
        c.open("t0").destroy()                              # room for one of uid 65534's again
        c.create("by-root", 4096)
        mine = fill(sock, "roots-own", 64)                  # root's own jobs: its own bound, untouched
        self.assertEqual((mine["made"], mine["errno"]), (64, 0))
        mine["client"].close()
        c.close()
        self.assertEqual(self.d.stop(), 0)


class NameTaken(unittest.TestCase):
    @unittest.skipIf(os.geteuid() != 0, "acting as another uid needs root")
    def test_squatted_name_says_what_to_do(self) -> None:
        """uid 65534 took "train" first: root's tier-admin rights aside, a third uid is refused with the owner
        and what to do; it said only who may attach, leaving the user to guess."""
        d = Tierd()
        self.addCleanup(d.cleanup)
        d.start()
        os.chmod(d.dir, 0o711)
        os.chmod(d.socket, 0o666)
        held_r, held_w = os.pipe()                     # the squatter holds "train"
        go_r, go_w = os.pipe()                         # ... until told to let go
        pid = os.fork()
        if pid == 0:                                   # the squatter: holds "train" until told
            try:
                os.close(go_w)
                os.close(held_r)
                os.setgroups([])
                os.setresgid(NOBODY, NOBODY, NOBODY)
                os.setresuid(NOBODY, NOBODY, NOBODY)
                c = tier.Client("train", socket=d.socket)
                os.write(held_w, b"y")
                os.read(go_r, 1)
                c.close()
            finally:
                os._exit(0)
        os.close(held_w)
        os.close(go_r)
        self.assertEqual(os.read(held_r, 1), b"y")

        def other() -> dict:
            try:
                tier.Client("train", socket=d.socket)
            except tier.TierError as e:
                return {"errno": e.errno, "error": e.strerror}
            return {"errno": 0, "error": ""}

        got = as_uid(12345, other)
        os.close(go_w)                                 # let go (EOF)
        os.waitpid(pid, 0)
        os.close(held_r)
        self.assertEqual(got["errno"], errno.EACCES, got)
        self.assertIn(f"job 'train' belongs to uid {NOBODY}: uid 12345 (pid ", got["error"])
        self.assertIn(f"use another job name, or have uid {NOBODY} or an admin end it (tierctl detach; "
                      "tierctl jobs shows it)", got["error"])
        self.assertEqual(d.stop(), 0)


OWNER = 12345


class NameOwner(unittest.TestCase):
    @unittest.skipIf(os.geteuid() != 0, "acting as another uid needs root")
    def test_owned_name_refuses_others(self) -> None:
        """[quota] job = nightly, owner = 12345: uid 65534 and root are refused "nightly" with the rule and
        what to do; uid 12345 gets the name's max and guarantee, whose source names the owner."""
        cfg = CONFIG + ("[quota]\njob = nightly\nowner = %d\nhost = 40M\nhost_min = 16M\n"
                        "[quota]\nuid = %d\nhost = 8M\n"
                        "[quota]\njob = shared\nhost_min = 8M\n" % (OWNER, NOBODY))
        d = Tierd(cfg)
        self.addCleanup(d.cleanup)
        d.start()
        os.chmod(d.dir, 0o711)
        os.chmod(d.socket, 0o666)
        self.assertIn("[quota] job = shared has no owner: any user who names a job so first gets its host_min 8M",
                      d.log_text())
        self.assertNotIn("job = nightly has no owner", d.log_text())
        sock = d.socket

        def hello() -> dict:
            try:
                c = tier.Client("nightly", socket=sock)
            except tier.TierError as e:
                return {"errno": e.errno, "error": e.strerror}
            q = c.quota()
            c.close()
            return {"errno": 0, "host": q.limits["host"], "host_min": q.minimums["host"],
                    "from": q.sources["host_min"] if q.sources else None}

        got = as_uid(NOBODY, hello)
        self.assertEqual(got["errno"], errno.EACCES, got)
        self.assertIn(f"job name 'nightly' belongs to uid {OWNER} ([quota] job = nightly has owner = {OWNER}): "
                      f"uid {NOBODY} (pid ", got["error"])
        self.assertIn("use another job name, or have an admin change the rule's owner", got["error"])
        self.assertEqual(hello()["errno"], errno.EACCES)       # root too: the name is the owner's alone
        got = as_uid(OWNER, hello)
        self.assertEqual((got["errno"], got["host"], got["host_min"]), (0, 40 << 20, 16 << 20), got)
        self.assertEqual(got["from"], f"job 'nightly' (tierd.conf, owner uid {OWNER})")
        self.assertEqual(d.stop(), 0)

    @unittest.skipIf(os.geteuid() != 0, "acting as another uid needs root")
    def test_restored_job_of_another_uid(self) -> None:
        """uid 65534's "nightly" is in the NVMe index when a restart names owner 12345: the job is restored
        with its tensor, the name's rule does not apply to it (said in the log), and 12345 is refused the
        name while it exists (the name is held) until it ends."""
        cfg = CONFIG.replace("linger_sec = 0", "linger_sec = 600")
        rule = "[quota]\njob = nightly\nhost = 40M\nhost_min = 16M\n"
        d = Tierd(cfg + rule)
        self.addCleanup(d.cleanup)
        d.start()
        os.chmod(d.dir, 0o711)
        os.chmod(d.socket, 0o666)
        sock = d.socket

        def make() -> dict:
            c = tier.Client("nightly", socket=sock)
            c.create("t", 4096)
            q = c.quota()
            c.close()
            return {"host": q.limits["host"]}

        self.assertEqual(as_uid(NOBODY, make), {"host": 40 << 20})     # no owner: the name's rule is its
        self.assertEqual(d.stop(), 0)
        with open(d.config, "w") as f:
            f.write((cfg + rule.replace("job = nightly\n", "job = nightly\nowner = %d\n" % OWNER))
                    .replace("@DIR@", d.dir))
        d.start()
        os.chmod(d.socket, 0o666)
        self.assertIn(f"Job 'nightly' of uid {NOBODY}: the quota of its name does not apply to it: the name's "
                      f"owner is uid {OWNER}", d.log_text())

        def hello() -> dict:
            try:
                tier.Client("nightly", socket=sock).close()
            except tier.TierError as e:
                return {"errno": e.errno, "error": e.strerror}
            return {"errno": 0}

        got = as_uid(OWNER, hello)
        self.assertEqual(got["errno"], errno.EACCES, got)
        self.assertIn(f"job 'nightly' belongs to uid {NOBODY}", got["error"])
        self.assertEqual(d.stop(), 0)


if __name__ == "__main__":
    main()
