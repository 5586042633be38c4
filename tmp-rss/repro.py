#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Issue 27 item 7: tierd's RSS with job churn.

Starts a real tierd (tests/python/tierd.py's CONFIG: linger_sec = 0, so a job
goes with its last connection) and runs ROUNDS job rounds: connect a client of
a new job "churn-I", create two tensors, pin one to HOST and write it, destroy
the other, close the client.  --batch K keeps K jobs' clients open at once
(K jobs made, then all K closed).  Samples tierd's VmRSS (/proc/PID/status)
and the Rss of its [heap] and anonymous mappings at the marks, after a short
settle; the figure that matters is VmRSS at ROUNDS minus at 1000.

  TIER_SOURCE=checkout TIER_BUILD=build /usr/bin/python3 tmp-rss/repro.py [ROUNDS] [--batch=K] [--same-name] [--async] [--status] [--nopin] [--linger=S] [--mstats [--trim]]
  TIERD_ENV="MALLOC_ARENA_MAX=1 ..."   extra environment for tierd
"""
import os, sys, time

src = os.environ.get("TIER_SOURCE") or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(src, "tests", "python"))
sys.path.insert(0, os.path.join(src, "client", "python"))
import tierd  # noqa: E402
import tier  # noqa: E402

opts = dict(a[2:].split("=", 1) if "=" in a else (a[2:], "1") for a in sys.argv[1:] if a.startswith("--"))
args = [a for a in sys.argv[1:] if not a.startswith("--")]
ROUNDS = int(args[0]) if args else 10000
BATCH = int(opts.get("batch", 1))
SAME = "same-name" in opts
ASYNC = "async" in opts     # evict to NVMe and prefetch to VRAM, unwaited, before the close
STATUS = "status" in opts
NOPIN = "nopin" in opts     # no pin (lingering jobs would hold the host segments)
MSTATS = "mstats" in opts   # glibc malloc_stats() of tierd at the marks (gdb), --trim: malloc_trim(0) first
DUMP = opts.get("dump")     # --dump=PREFIX: mt_dump(PREFIX.N) at the marks (tierd run with LD_PRELOAD=mtrace.so)
LINGER = int(opts.get("linger", 0))  # [daemon] linger_sec; the marks wait it out   # a status and a Prometheus status per job
MARKS = sorted({100, ROUNDS} | set(range(1000, ROUNDS + 1, 1000)))
for kv in os.environ.get("TIERD_ENV", "").split():
    k, v = kv.split("=", 1)
    os.environ[k] = v
# host pool of 256 segments of 1M (a job takes one segment for its pinned tensor), so
# up to ~250 jobs may hold host memory at once; more connections than the default
config = (tierd.CONFIG
          .replace("[daemon]\n", "[daemon]\nmax_connections = 4096\nmax_connections_per_uid = 4096\n")
          .replace("linger_sec = 0", f"linger_sec = {LINGER}")
          .replace("capacity = 64M\nsegment_size = 16M", "capacity = 256M\nsegment_size = 1M"))


def status(pid, keys=("VmRSS", "RssAnon", "RssShmem", "VmData")):
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k = line.split(":")[0]
            if k in keys:
                out[k] = int(line.split()[1])
    return out


def heap(pid):
    """KiB: Rss of [heap], of unnamed anonymous mappings, and the number of mappings."""
    h = a = n = 0
    cur = None
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            p = line.split()
            if "-" in p[0] and len(p) >= 5 and ":" not in p[0]:
                cur = " ".join(p[5:])
                n += 1
            elif p[0] == "Rss:":
                if cur == "[heap]":
                    h += int(p[1])
                elif cur == "":
                    a += int(p[1])
    return {"heap": h, "anon": a, "maps": n, "fds": len(os.listdir(f"/proc/{pid}/fd"))}


def mstats(pid, trim):
    """In-use and system bytes of tierd's malloc (malloc_stats() through gdb, into tierd's log)."""
    import subprocess
    with open(d.log) as f:
        f.seek(0, 2)
        at = f.tell()
    cmds = (["-ex", "call (int) malloc_trim(0)"] if trim else []) + ["-ex", "call (void) malloc_stats()"]
    subprocess.run(["gdb", "-p", str(pid), "-batch", "-nx"] + cmds, capture_output=True, timeout=60)
    with open(d.log) as f:
        f.seek(at)
        text = f.read()
    tot = [ln for ln in text.splitlines() if ln.startswith(("Total", "system bytes", "in use bytes"))]
    return "    malloc_stats: " + " | ".join(" ".join(ln.split()) for ln in tot[-4:])


WRAP = os.environ.get("TIERD_WRAP", "").split()  # e.g. "heaptrack -o /tmp/x" or "valgrind --tool=massif"
if WRAP:
    _popen = tierd.subprocess.Popen
    tierd.subprocess.Popen = lambda argv, **kw: _popen(WRAP + argv, **kw)


def tierd_pid(p):
    """tierd's pid: @p's, or under TIERD_WRAP the descendant that runs tierd."""
    if not WRAP:
        return p
    for _ in range(100):
        for q in os.listdir("/proc"):
            try:
                if q.isdigit() and os.readlink(f"/proc/{q}/exe").endswith("/tierd"):
                    return int(q)
            except OSError:
                pass
        time.sleep(0.1)
    return p


d = tierd.Tierd(config, log_level="info")
try:
    d.start()
except Exception:
    d.cleanup()
    raise
pid = tierd_pid(d.proc.pid)
try:
    print(f"tierd pid {pid}, rounds {ROUNDS}, batch {BATCH}, env {os.environ.get('TIERD_ENV', '')}")
    print(f"start: {status(pid)} {heap(pid)}", flush=True)
    t0 = time.monotonic()
    base = None
    i = 0
    while i < ROUNDS:
        open_ = []
        for _ in range(BATCH):
            i += 1
            c = tier.Client("churn" if SAME else f"churn-{i}", 0, socket=d.socket)
            t = c.create("a", 256 << 10)
            u = c.create(f"b{i % 5}", 64 << 10)
            if not NOPIN:
                with t.pin(tier.HOST) as g:
                    g.memoryview()[:4] = b"abcd"
            u.destroy()
            if ASYNC:  # copies still in flight when the job ends
                t.evict_async(tier.NVME)
                t.prefetch_async(tier.VRAM)
            if STATUS:
                c.status()
                c.status_prometheus()
            open_.append(c)
        for c in open_:
            c.close()
        if i in MARKS:
            if LINGER:
                s = status(pid)
                print(f"{i:6d} jobs, lingering: {s} {heap(pid)}", flush=True)
            time.sleep(0.5 + LINGER * 1.5)  # let tierd finish destroying the jobs
            s = status(pid)
            if i == 1000:
                base = s["VmRSS"]
            extra = f" VmRSS-vs-1000 {s['VmRSS'] - base:+d} KiB" if base is not None else ""
            if DUMP:  # live allocations of an LD_PRELOADed tracer (tmp-rss/mtrace.c)
                import subprocess, shutil
                shutil.copy(f"/proc/{pid}/maps", f"{DUMP}.{i}.maps")
                g = subprocess.run(["gdb", "-p", str(pid), "-batch", "-nx", "-ex",
                                'call (int) mt_dump()'], capture_output=True, text=True, timeout=120)
                if "DEBUG" in opts:
                    print(g.stdout[-2000:], g.stderr[-2000:])
            if MSTATS:
                print(mstats(pid, "trim" in opts), flush=True)
                s = status(pid)
            print(f"{i:6d} jobs {time.monotonic() - t0:6.1f}s {s} {heap(pid)}{extra}", flush=True)
finally:
    rc = d.stop()
    d.cleanup()
    print("tierd exit", rc)
