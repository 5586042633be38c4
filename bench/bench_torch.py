#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""bench_torch.py: tier.torch on one model, against plain PyTorch and the physical bound, in one run.

``bench/run torch`` starts a private tierd (its config sized by ``--sizes``,
below) and runs this program, which prints exactly one JSON line on stdout
(the table and progress go to stderr).  In one run it measures:

* baselines: fio read and write on the directory of tierd's target file,
  set up as tierd's ring is (``--bs=1M --iodepth=QD --ioengine=io_uring
  --direct=1 --fixedbufs --registerfiles``, QD tierd's ``[nvme] queue_depth``
  from ``--queue-depth``; as bench-io), and
  the host<->VRAM link: a one-thread memcpy (torch ``copy_`` of 256 MiB,
  best of 5) for emulated VRAM, whose copies are memcpys on one thread of
  tierd, or host<->device copies for the cuda backend;
* ``plain``: the model under plain PyTorch (``torch.optim.AdamW``);
* ``fit``: tier.torch, placement A, budgets above the whole state;
* placements A, B and C under the same tight budgets (a few blocks' worth),
  C being ``offload``, compared with its lower bound.

Every configuration runs in a child process of its own (``--child``), so that
its peak RSS is its own, on the same seed and batches; the tier.torch ones
run as jobs whose quotas were set before they connected (a holder client
makes the job, an admin connection sets the quota).  Their losses must equal
plain PyTorch's bit for bit (``verified``); the benchmark reports, never
asserts.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import queue
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
EXAMPLES = os.path.join(ROOT, "client", "python", "examples")
sys.path.insert(0, os.path.join(ROOT, "client", "python"))
sys.path.insert(0, EXAMPLES)

GB = 1e9
MIB = 1 << 20
CONFIGS = ("plain", "fit", "A", "B", "C")
MODELS = ("bytelm", "gpt2")
FIO_BS = "1M"
# tierd's [nvme] queue_depth when --queue-depth is not given (its default, and bench/run's)
QUEUE_DEPTH = 64


def log(msg: str) -> None:
    print(f"bench_torch: {msg}", file=sys.stderr, flush=True)


def size(text: str) -> int:
    """'8M', '512K', '1G' or bytes (powers of 1024)."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    try:
        return int(t[:-1]) * units[t[-1]] if t and t[-1] in units else int(t)
    except (ValueError, KeyError):
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 8M)") from None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="tier.torch vs plain PyTorch and the offload bound (bench/run torch)")
    p.add_argument("--socket", help="tierd's socket")
    p.add_argument("--dir", help="directory of tierd's target file: fio runs there")
    p.add_argument("--tierd-pid", type=int, help="tierd's pid, for its VmHWM and RssShmem")
    p.add_argument("--model", choices=MODELS, default="bytelm",
                   help="bytelm: the example's ByteLM (--dim, --layers, --heads); gpt2: Hugging Face's GPT-2 small "
                   "(124 M parameters, tied embeddings; needs transformers: bench/run uses the test venv)")
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=12, help="measured steps (after --warmup)")
    p.add_argument("--warmup", type=int, default=3, help="unmeasured steps first (>= 1: tier.torch traces "
                   "the first step)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--accumulate", type=int, default=1, help="micro-batches per step (the loss divided by it)")
    p.add_argument("--clip", type=float, help="clip_grad_norm_(model.parameters(), CLIP) before each step")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument("--text", default="/usr/lib/python3*/**/*.py")
    p.add_argument("--text-bytes", type=int, default=4 << 20)
    p.add_argument("--host-limit", type=size, help="tight host budget (default: 6 x the largest block's "
                   "parameter bytes)")
    p.add_argument("--vram-limit", type=size, help="tight VRAM budget (default: 4 x the largest block's "
                   "parameter bytes)")
    p.add_argument("--fio-size", type=size, default=1 << 30, help="bytes per fio pass (default 1G)")
    p.add_argument("--queue-depth", type=int, default=QUEUE_DEPTH, help="tierd's [nvme] queue_depth in this "
                   f"run: fio's iodepth (default {QUEUE_DEPTH})")
    p.add_argument("--step-timeout", type=float, default=120, help="seconds one step (or a configuration's "
                   "start) may take before its process is killed and reported as not fitting (default 120)")
    p.add_argument("--sequential", action="store_true", help="run the configurations one after another "
                   "instead of interleaving their steps")
    p.add_argument("--configs", default=",".join(CONFIGS), help="subset of plain,fit,A,B,C (plain is always run)")
    p.add_argument("--sizes", action="store_true", help="print 'state_bytes largest_block_bytes host_tight "
                   "vram_tight fit' (bytes) and exit (bench/run sizes tierd's config with it)")
    # internal: one configuration in this process
    p.add_argument("--child", choices=CONFIGS, help=argparse.SUPPRESS)
    p.add_argument("--job", help=argparse.SUPPRESS)
    p.add_argument("--data", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.accumulate < 1:
        p.error("--accumulate must be at least 1")
    if a.warmup < 1 or a.steps < 1:
        p.error("--warmup and --steps must be at least 1")
    if not 1 <= a.queue_depth <= 4096:
        p.error("--queue-depth must be 1..4096 (tierd's range)")
    return a


# ---- the model ---------------------------------------------------------------------------------

def make_model(a: argparse.Namespace):
    import torch

    torch.manual_seed(a.seed)
    if a.model == "gpt2":
        try:
            import transformers
        except ImportError:
            raise SystemExit("bench_torch: --model gpt2 needs transformers (Debian 12 has none): run it with the "
                             "test venv's python (./scripts/test makes .venv-tests; bench/run uses it)") from None
        transformers.logging.set_verbosity_error()
        # GPT-2 small: 12 layers of 768, 50257 tokens (the byte batches are valid token ids), tied embeddings
        return transformers.GPT2LMHeadModel(transformers.GPT2Config(n_positions=max(1024, a.context)))
    import train_lm

    return train_lm.ByteLM(a.dim, a.layers, a.heads, a.context)


def model_name(a: argparse.Namespace) -> str:
    if a.model == "gpt2":
        return "GPT-2 small (Hugging Face GPT2LMHeadModel, 12 layers of 768, tied embeddings)"
    return f"ByteLM dim {a.dim}, {a.layers} layers"


def logits_of(model, x):
    out = model(x)
    return out.logits if hasattr(out, "logits") else out


def vocab_of(a: argparse.Namespace) -> int:
    return 50257 if a.model == "gpt2" else 256


def model_sizes(model) -> dict:
    """Parameters, and bytes as tier.torch lays them out (its blocks; four kinds each: p, g, m, v)."""
    import tier.torch as tt

    blocks = [b.nbytes for b in tt.layout.build(model, tt.auto_blocks(model)) if b.slots]
    return {
        "params": sum(p.numel() for p in model.parameters()),
        "blocks": len(blocks),
        "block_bytes_max": max(blocks),
        "param_bytes": sum(blocks),
        "state_bytes": 4 * sum(blocks),
    }


def budgets(a: argparse.Namespace, sz: dict) -> tuple[int, int, int]:
    """(tight host, tight VRAM, fit) budgets in bytes, whole MiB."""
    def mib(n: int) -> int:
        return (n + MIB - 1) // MIB * MIB

    # GPT-2: a quarter of its state in host (its 154 MB embedding is too large for six of it)
    host = mib(a.host_limit or (sz["state_bytes"] // 4 if a.model == "gpt2" else 6 * sz["block_bytes_max"]))
    vram = mib(a.vram_limit or 4 * sz["block_bytes_max"])
    fit = mib(sz["state_bytes"] * 5 // 4)       # every tier holds the whole state, and a quarter more
    return host, vram, fit


# ---- one configuration (child process) -------------------------------------------------------------

def child(a: argparse.Namespace) -> int:
    """One configuration, a step each time a line "go" comes on stdin; JSON lines on stdout:
    {"ready": true}, then {"step", "dt", "loss"} per step, then {"result": {...}} (also on a failure)."""
    import torch

    if a.threads:
        torch.set_num_threads(a.threads)
    model = make_model(a)
    vocab = vocab_of(a)
    data = torch.load(a.data)
    loss_fn = torch.nn.functional.cross_entropy
    out: dict = {"config": a.child, "fits": True, "error": None}
    client = engine = None

    def say(obj: dict) -> None:
        print(json.dumps(obj), flush=True)

    try:
        if a.child == "plain":
            opt = torch.optim.AdamW(model.parameters(), lr=a.lr)
        else:
            import tier
            import tier.torch

            client = tier.Client(a.job, socket=a.socket)
            placement = "A" if a.child == "fit" else a.child
            engine = tier.torch.Offload(model, client, lr=a.lr, placement=placement)
        say({"ready": True})
        times: list[float] = []
        losses: list[float] = []
        moved0: dict = {}
        stall0 = 0.0
        cpu0 = 0.0
        flt0 = 0
        acc = a.accumulate
        for i in range(len(data) // acc):
            micro = data[i * acc:(i + 1) * acc]
            if sys.stdin.readline().strip() != "go":
                log(f"{a.child}: stopped before step {i + 1}")
                return 0
            if i == a.warmup:
                cpu0 = time.process_time()
                flt0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
                if client is not None:
                    moved0, stall0 = client.moved(), engine.stall
            t0 = time.perf_counter()
            total = 0.0
            for x, y in micro:
                loss = loss_fn(logits_of(model, x).reshape(-1, vocab), y.reshape(-1)) / acc
                loss.backward()
                total += loss.item()
            if a.clip is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip)
            if engine is not None:
                engine.step()
                engine.zero_grad()
            else:
                opt.step()
                opt.zero_grad()
            dt = time.perf_counter() - t0
            losses.append(total)
            times.append(dt)
            say({"step": i + 1, "dt": dt, "loss": losses[-1]})
        out["cpu_s_per_step"] = (time.process_time() - cpu0) / a.steps
        out["minflt_per_step"] = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - flt0) / a.steps
        out["step_s_all"] = times[a.warmup:]
        out["losses"] = losses
        if engine is not None:
            now = client.moved()
            out["moved_per_step"] = {k: (now[k] - moved0.get(k, 0)) / a.steps for k in now}
            out["stall_s"] = engine.stall - stall0
            out["kept_up"] = engine.kept_up
            out["write_downs_refused"] = engine.write_downs_refused
            engine.close()              # the parameters come back into the model
            engine = None
        h = hashlib.sha256()
        for _, p in sorted(model.named_parameters()):
            h.update(p.detach().contiguous().numpy().tobytes())
        out["params_sha256"] = h.hexdigest()
    except Exception as e:  # noqa: BLE001 - a refused plan or no space: reported, not a crash
        import tier

        if not isinstance(e, tier.TierError):
            raise
        out["fits"] = False
        out["error"] = f"{type(e).__name__}: {e}"
        log(f"{a.child}: does not fit: {out['error']}")
    finally:
        if engine is not None:
            try:
                engine.close(restore=False)
            except Exception as e:  # noqa: BLE001
                log(f"{a.child}: closing the engine: {e}")
        if client is not None:
            client.close()
    # VmHWM, not getrusage()'s ru_maxrss: Linux carries ru_maxrss over fork and exec, so a child's
    # would be at least the parent's peak (this parent's is the 512 MiB of the memcpy baseline)
    st = proc_status(os.getpid())
    out["rss_peak_bytes"] = st.get("VmHWM", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    out["rss_shmem_bytes"] = st.get("RssShmem")
    say({"result": out})
    return 0


# ---- baselines --------------------------------------------------------------------------------

def run_fio(directory: str, rw: str, nbytes: int, qd: int) -> float:
    """fio's bytes/s for one pass of @rw over @nbytes in @directory at depth @qd (bench-io's settings)."""
    cmd = ["fio", "--name=w", f"--directory={directory}", "--filename=fio-torch.dat", f"--size={nbytes}",
           f"--bs={FIO_BS}", f"--iodepth={qd}", "--ioengine=io_uring", "--direct=1", "--fixedbufs",
           "--registerfiles", f"--rw={rw}", "--output-format=json"]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=sys.stderr, text=True)
    if r.returncode != 0:
        raise SystemExit(f"bench_torch: fio --rw={rw} failed (status {r.returncode})")
    return float(json.loads(r.stdout)["jobs"][0][rw]["bw_bytes"])


def link_baseline(backend: str) -> tuple[str, float | None]:
    """(what was measured, bytes/s) of the host<->VRAM link."""
    import torch

    n = 256 * MIB
    if backend == "cuda":
        if not torch.cuda.is_available():
            log("cuda VRAM backend but this torch has no CUDA: no link baseline")
            return "cuda", None
        h = torch.empty(n, dtype=torch.uint8).pin_memory()
        d = torch.empty(n, dtype=torch.uint8, device="cuda")
        best = math.inf
        for _ in range(5):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            d.copy_(h, non_blocking=True)
            h.copy_(d, non_blocking=True)
            torch.cuda.synchronize()
            best = min(best, time.perf_counter() - t0)
        return "cuda", 2 * n / best              # both directions, one after the other, as the bytes are summed
    # emulated: tierd's mover thread memcpys every copy, one at a time, so one thread here
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        src = torch.ones(n, dtype=torch.uint8)
        dst = torch.zeros(n, dtype=torch.uint8)
        dst.copy_(src)
        best = math.inf
        for _ in range(5):
            t0 = time.perf_counter()
            dst.copy_(src)
            best = min(best, time.perf_counter() - t0)
    finally:
        torch.set_num_threads(threads)
    return "memcpy (emulated vram)", n / best


# ---- tierd's memory ------------------------------------------------------------------------------

def proc_status(pid: int | None) -> dict[str, int]:
    """VmHWM, VmRSS, RssAnon, RssShmem of @pid in bytes (empty without a pid)."""
    out: dict[str, int] = {}
    if not pid:
        return out
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                k, _, v = line.partition(":")
                if k in ("VmHWM", "VmRSS", "RssAnon", "RssShmem"):
                    out[k] = int(v.split()[0]) * 1024
    except OSError as e:
        log(f"reading /proc/{pid}/status: {e}")
    return out


def reset_hwm(pid: int | None) -> bool:
    """Reset @pid's VmHWM to its current RSS (clear_refs 5; needs root or the same user)."""
    if not pid:
        return False
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def cpu_times(tierd_pid: int | None) -> dict[str, float]:
    """Seconds of CPU: the machine's busy and steal time (/proc/stat), this process and its
    waited-for children (getrusage), tierd (/proc/PID/stat)."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {"busy": 0.0, "steal": 0.0, "ours": 0.0, "tierd": 0.0}
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        # user nice system idle iowait irq softirq steal guest guest_nice (guest is in user)
        out["busy"] = (v[0] + v[1] + v[2] + v[5] + v[6]) / tick
        out["steal"] = v[7] / tick if len(v) > 7 else 0.0
    except (OSError, ValueError, IndexError):
        pass
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        ru = resource.getrusage(who)
        out["ours"] += ru.ru_utime + ru.ru_stime
    if tierd_pid:
        try:
            with open(f"/proc/{tierd_pid}/stat") as f:
                fields = f.read().rpartition(")")[2].split()
            out["tierd"] = (int(fields[11]) + int(fields[12])) / tick      # utime, stime
        except (OSError, ValueError, IndexError):
            pass
    return out


def tierd_threads_cpu(tierd_pid: int | None) -> dict[str, float]:
    """Seconds of CPU of tierd's threads by name (/proc/PID/task/TID/stat): "tierd" is its event loop,
    "tierd-csum" the checksum workers, "tierd-renew" the segment renewers, "tierd-mover" the emulated
    VRAM's copies."""
    out: dict[str, float] = {}
    if not tierd_pid:
        return out
    tick = os.sysconf("SC_CLK_TCK")
    try:
        tids = os.listdir(f"/proc/{tierd_pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{tierd_pid}/task/{tid}/stat") as f:
                head, _, rest = f.read().rpartition(")")
            name = head.partition("(")[2]
            fields = rest.split()
            out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
        except (OSError, ValueError, IndexError):
            pass
    return out


# Seconds between two status requests of the Sampler (bench/README.md says so too).
SAMPLE_S = 0.05


class Sampler(threading.Thread):
    """Polls tierd's status every SAMPLE_S for the peak use of each tier by the jobs that run now, timing each
    round trip (how long tierd's loop takes to answer while the jobs run)."""

    def __init__(self, admin, jobs: list[str], lock: threading.Lock) -> None:
        super().__init__(daemon=True)
        self.admin, self.lock = admin, lock
        self.peak = {j: {"vram": 0, "host": 0, "nvme": 0} for j in jobs}
        self.rtt: list[float] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(SAMPLE_S):
            with self.lock:
                try:
                    t0 = time.monotonic()
                    st = self.admin.status()
                    self.rtt.append(time.monotonic() - t0)
                except Exception:  # noqa: BLE001 - best effort
                    continue
            for j in st.get("jobs", []):
                peak = self.peak.get(j["name"])
                if peak is not None:
                    for t in peak:
                        peak[t] = max(peak[t], j["usage"][t]["used"])


def tierd_answers(socket: str, timeout: float = 10.0) -> bool:
    """Does tierd answer a status request within @timeout seconds?  (libtier's calls have no timeout.)"""
    import tier

    ok = threading.Event()

    def ask() -> None:
        try:
            with tier.Client("", socket=socket) as c:
                c.status()
            ok.set()
        except Exception:  # noqa: BLE001
            pass

    threading.Thread(target=ask, daemon=True).start()
    return ok.wait(timeout)


# ---- the parent --------------------------------------------------------------------------------

_children: list[subprocess.Popen] = []       # for the SIGTERM handler


def on_term(signum: int, frame) -> None:
    """bench/run stops us (interrupted): take the configurations' processes along."""
    for p in _children:
        if p.poll() is None:
            p.kill()
    raise SystemExit(128 + signum)


class Run:
    """One configuration's child process (``--child``): a step per "go", its lines through a queue."""

    def __init__(self, a: argparse.Namespace, config: str, data_path: str, job: str | None) -> None:
        self.config, self.job = config, job
        cmd = [sys.executable, os.path.abspath(__file__), "--child", config, "--data", data_path,
               "--model", a.model, "--dim", str(a.dim), "--layers", str(a.layers), "--heads", str(a.heads), "--context",
               str(a.context), "--batch", str(a.batch), "--steps", str(a.steps), "--warmup", str(a.warmup),
               "--lr", repr(a.lr), "--seed", str(a.seed), "--threads", str(a.threads),
               "--accumulate", str(a.accumulate)] + (["--clip", repr(a.clip)] if a.clip is not None else [])
        if job:
            cmd += ["--socket", a.socket, "--job", job]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=sys.stderr,
                                     text=True, bufsize=1)
        _children.append(self.proc)
        self.lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.result: dict | None = None
        self.settle: list[float] = []        # seconds tierd went on moving the job's data after its steps
        self.tierd_cpu: dict[str, float] = {}   # tierd's CPU seconds by thread name in the measured steps
        self.dt: list[float] = []

    def _read(self) -> None:
        for line in self.proc.stdout:
            if line.startswith("{"):
                self.lines.put(json.loads(line))
        self.lines.put(None)

    @property
    def active(self) -> bool:
        return self.result is None

    def get(self, timeout: float) -> dict:
        """The next message; raises queue.Empty after @timeout, SystemExit if the child died."""
        msg = self.lines.get(timeout=timeout)
        if msg is None:
            self.proc.wait()
            raise SystemExit(f"bench_torch: configuration {self.config} exited (status {self.proc.returncode}) "
                             "without a result")
        return msg

    def go(self) -> None:
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def kill(self, why: str, timed_out: bool = False) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.result = {"config": self.config, "fits": False, "timed_out": timed_out, "error": why,
                       "rss_peak_bytes": None}

    def finish(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def settle(admin, lock: threading.Lock, job: str, cap: float = 0.5) -> float:
    """Wait until tierd stops moving @job's data (its link counters stay the same for 20 ms), at most
    @cap seconds; the seconds waited.  Interleaved, a job's leftover transfers then do not run in the
    next configuration's step."""
    t0 = time.monotonic()
    last = None
    same = 0
    while time.monotonic() - t0 < cap:
        with lock:
            st = admin.status()
        now = next((sum(j["moved"].values()) for j in st["jobs"] if j["name"] == job), None)
        same = same + 1 if now == last else 0
        if same >= 2:
            break
        last = now
        time.sleep(0.01)
    return time.monotonic() - t0


def first_difference(x: list[float], y: list[float]) -> int | None:
    """1-based step of the first difference (or of the shorter list's end), None if equal."""
    for i, (u, v) in enumerate(zip(x, y)):
        if u != v:
            return i + 1
    return None if len(x) == len(y) else min(len(x), len(y)) + 1


def r(x: float | None, n: int = 4) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else round(x, n)


def parent(a: argparse.Namespace) -> int:
    import torch
    import train_lm

    import tier

    signal.signal(signal.SIGTERM, on_term)
    if not a.socket or not a.dir:
        raise SystemExit("bench_torch: --socket and --dir are required (bench/run torch passes them)")
    configs = [c.strip() for c in a.configs.split(",") if c.strip()]
    for c in configs:
        if c not in CONFIGS:
            raise SystemExit(f"bench_torch: --configs: unknown configuration {c!r} (plain, fit, A, B, C)")
    if "plain" not in configs:
        configs.insert(0, "plain")
    t_start = time.monotonic()

    model = make_model(a)
    sz = model_sizes(model)
    del model
    host_tight, vram_tight, fit_limit = budgets(a, sz)
    log(f"{model_name(a)}, context {a.context}, batch {a.batch}: {sz['params'] / 1e6:.2f} M "
        f"parameters, {sz['blocks']} blocks, state {sz['state_bytes'] / MIB:.1f} MiB (largest block's parameters "
        f"{sz['block_bytes_max'] / MIB:.2f} MiB); tight budgets host {host_tight / MIB:.0f} MiB, "
        f"vram {vram_tight / MIB:.0f} MiB")

    # the same batches for every configuration
    text = train_lm.load_text(a.text, a.text_bytes)
    gen = train_lm.batches(text, a.batch, a.context, a.seed, 0, 1)
    data = [next(gen) for _ in range((a.warmup + a.steps) * a.accumulate)]
    tmp = tempfile.mkdtemp(prefix="bench-torch.", dir=a.dir)
    data_path = os.path.join(tmp, "batches.pt")
    torch.save(data, data_path)

    # baselines
    log(f"fio write and read, {a.fio_size / MIB:.0f} MiB each, in {a.dir}")
    try:
        fio_w = run_fio(a.dir, "write", a.fio_size, a.queue_depth)
        fio_r = run_fio(a.dir, "read", a.fio_size, a.queue_depth)
    finally:
        try:
            os.unlink(os.path.join(a.dir, "fio-torch.dat"))
        except OSError:
            pass
    admin = tier.Client("", socket=a.socket)
    backend = admin.vram_backend
    link_kind, link_bw = link_baseline(backend)
    log(f"baselines: fio write {fio_w / GB:.3f} GB/s, read {fio_r / GB:.3f} GB/s; link ({link_kind}) "
        + (f"{link_bw / GB:.3f} GB/s" if link_bw else "unmeasured"))

    results: dict[str, dict] = {}
    lock = threading.Lock()
    hwm_reset = True
    stuck: str | None = None        # the configuration after which tierd stopped answering
    # interleaved (default): every configuration at once, one step each in turn (the order rotating
    # each round), so that the machine's drift in speed hits them all alike; --sequential: one
    # configuration after another, tierd's VmHWM per configuration
    groups = [[c] for c in configs] if a.sequential else [configs]
    rounds: dict[str, list[float]] = {c: [] for c in configs}     # step times by round, all steps
    status_rtt: list[float] = []    # seconds of each status round trip while the configurations ran
    for group in groups:
        if stuck:
            for c in group:
                results[c] = {"config": c, "fits": False, "skipped": True, "rss_peak_bytes": None,
                              "error": f"not run: tierd stopped answering during configuration {stuck}",
                              "tierd": proc_status(a.tierd_pid), "cpu": {}}
            continue
        holders = []
        jobs = {}
        for c in group:
            if c == "plain":
                continue
            job = jobs[c] = f"bench-torch-{c}"
            budget = (fit_limit, fit_limit) if c == "fit" else (host_tight, vram_tight)
            holders.append(tier.Client(job, socket=a.socket))      # the job exists while this holds it
            try:
                admin.set_quota(job, host=budget[0], vram=budget[1])
            except tier.TierError as e:
                hint = (": run as root or as a member of tierd's admin group"
                        if isinstance(e, tier.PermissionDeniedError) else "")
                raise SystemExit(f"bench_torch: tierd refused to set job {job}'s quota ({e}){hint}") from None
            q = admin.quota(job).limits
            if q["host"] != budget[0] or q["vram"] != budget[1]:
                raise SystemExit(f"bench_torch: job {job}'s quota is host {q['host']}, vram {q['vram']}, "
                                 f"not the {budget} set")
            log(f"{c}: job {job}, host limit {budget[0] / MIB:.0f} MiB, vram limit {budget[1] / MIB:.0f} MiB")
        sampler = Sampler(admin, list(jobs.values()), lock)
        sampler.start()
        hwm_reset = reset_hwm(a.tierd_pid) and hwm_reset
        log(f"--- {', '.join(group)}" + (" (interleaved)" if len(group) > 1 else ""))
        t0 = time.monotonic()
        cpu0 = cpu_times(a.tierd_pid)
        runs = [Run(a, c, data_path, jobs.get(c)) for c in group]
        for run in runs:
            try:
                msg = run.get(a.step_timeout)
            except queue.Empty:
                run.kill(f"not ready after {a.step_timeout:.0f} s (killed)", timed_out=True)
                continue
            if "result" in msg:
                run.result = msg["result"]
        for k in range(a.warmup + a.steps):
            alive = [run for run in runs if run.active]
            if not alive:
                break
            order = alive[k % len(alive):] + alive[:k % len(alive)]
            for run in order:
                if not run.active:          # stopped in this round (tierd stopped answering)
                    continue
                cpu_a = tierd_threads_cpu(a.tierd_pid) if run.job else {}
                run.go()
                try:
                    msg = run.get(a.step_timeout)
                except queue.Empty:
                    # a phase that never becomes ready (tier_phase_enter() has no timeout), or plain PyTorch itself
                    # too slow (the machine short of memory): reported
                    why = ("the trainer waited in a phase tierd never made ready, or the machine is short of "
                           "memory (free -m)" if run.job else
                           "plain PyTorch, without tierd, took that long: the machine is short of memory (free -m: "
                           "tierd's pools and the trainers together) or the step needs a longer --step-timeout")
                    run.kill(f"step {k + 1} not done after {a.step_timeout:.0f} s (killed): {why}", timed_out=True)
                    log(f"{run.config}: step {k + 1} not done after {a.step_timeout:.0f} s: killed")
                    if not tierd_answers(a.socket):
                        stuck = run.config
                        log(f"tierd does not answer after {run.config}'s step {k + 1} timed out: the other "
                            "tier.torch configurations are stopped (plain PyTorch goes on)")
                        for other in runs:
                            if other.active and other.job:
                                other.kill(f"stopped: tierd stopped answering during configuration {stuck}")
                    continue
                if "result" in msg:                 # failed in this step
                    run.result = msg["result"]
                    continue
                run.dt.append(msg["dt"])
                rounds[run.config].append(msg["dt"])
                log(f"{run.config}: step {msg['step']}/{a.warmup + a.steps} loss {msg['loss']:.6f} "
                    f"{msg['dt'] * 1e3:.0f} ms")
                if msg["step"] == a.warmup + a.steps:
                    try:
                        run.result = run.get(a.step_timeout)["result"]
                    except queue.Empty:
                        run.kill("no result after its last step (killed)", timed_out=True)
                elif len(group) > 1 and run.job and not stuck:
                    run.settle.append(settle(admin, lock, run.job))
                if run.job and msg["step"] > a.warmup:
                    # tierd's CPU in this step, and in what it went on moving for it (settle): in turn,
                    # nothing of the other configurations runs meanwhile
                    for name, v in tierd_threads_cpu(a.tierd_pid).items():
                        run.tierd_cpu[name] = run.tierd_cpu.get(name, 0.0) + v - cpu_a.get(name, 0.0)
        for run in runs:
            if run.active:                  # cannot happen: every step either reported or killed
                run.kill("did not report its result")
            run.finish()
        cpu1 = cpu_times(a.tierd_pid)
        wall = time.monotonic() - t0
        sampler.stop.set()
        sampler.join(5.0)                   # stuck in a status request if tierd stopped answering
        for h in holders:
            h.close()
        d = {k: cpu1[k] - cpu0[k] for k in cpu0}
        # CPUs busy with anything but this benchmark and its tierd (another job, a test suite): the
        # figures of a configuration that ran beside such load are not its own
        cpu = {"bench": d["ours"] / wall, "tierd": d["tierd"] / wall,
               "other": max(0.0, d["busy"] - d["ours"] - d["tierd"]) / wall, "steal": d["steal"] / wall}
        tierd_mem = proc_status(a.tierd_pid)
        for run in runs:
            res = run.result
            res["wall_s"] = wall
            res["cpu"] = cpu
            res["tierd"] = tierd_mem
            if run.job:
                res["job_peak_bytes"] = sampler.peak[run.job]
            if run.settle:
                res["settle_s"] = run.settle
            if run.tierd_cpu:
                res["tierd_cpu_s"] = run.tierd_cpu
            results[run.config] = res
        status_rtt.extend(sampler.rtt)
    if not stuck:
        admin.close()
    try:
        os.unlink(data_path)
        os.rmdir(tmp)
    except OSError:
        pass

    # ---- figures
    tokens = a.batch * a.context * a.accumulate
    plain = results["plain"]
    if not plain["fits"]:
        raise SystemExit(f"bench_torch: plain PyTorch did not run to the end: {plain['error']}")
    plain_step = statistics.median(plain["step_s_all"])

    def summary(res: dict) -> dict:
        if not res["fits"]:
            return {"fits": False, "error": res["error"], "step_s": None, "tokens_per_s": None, "busy": None,
                    "rss_peak_bytes": res["rss_peak_bytes"], "timed_out": res.get("timed_out", False),
                    "tierd_hwm_bytes": res["tierd"].get("VmHWM"), "tierd_shmem_bytes": res["tierd"].get("RssShmem"),
                    "nvme_read_gb_per_step": None, "nvme_write_gb_per_step": None,
                    "cpus_busy": {k: r(v, 2) for k, v in res["cpu"].items()}, "skipped": res.get("skipped", False)}
        step = statistics.median(res["step_s_all"])
        window = sum(res["step_s_all"])
        mv = res.get("moved_per_step", {})
        s = {"fits": True, "step_s": r(step), "tokens_per_s": r(tokens / step, 1),
             "busy": r(1 - res["stall_s"] / window, 3) if "stall_s" in res else None,
             "stall_s_per_step": r(res["stall_s"] / a.steps) if "stall_s" in res else None,
             "rss_peak_bytes": res["rss_peak_bytes"],
             "tierd_hwm_bytes": res["tierd"].get("VmHWM"), "tierd_shmem_bytes": res["tierd"].get("RssShmem"),
             "nvme_read_gb_per_step": r(mv.get("nvme->host", 0) / GB),
             "nvme_write_gb_per_step": r(mv.get("host->nvme", 0) / GB),
             "link_gb_per_step": r((mv.get("host->vram", 0) + mv.get("vram->host", 0)) / GB),
             "moved_gb_per_step": {k: r(v / GB) for k, v in mv.items()} if mv else None,
             "cpu_s_per_step": r(res["cpu_s_per_step"]),
             "minflt_per_step": r(res.get("minflt_per_step")),
             "step_s_all": [r(t, 3) for t in res["step_s_all"]],
             }
        s["cpus_busy"] = {k: r(v, 2) for k, v in res["cpu"].items()}
        if "job_peak_bytes" in res:
            s["job_peak_bytes"] = res["job_peak_bytes"]
        if "kept_up" in res:
            s["kept_up"] = res["kept_up"]
            s["write_downs_refused"] = res.get("write_downs_refused", 0)
        if res.get("settle_s"):
            s["settle_s_per_step"] = r(statistics.mean(res["settle_s"]))
        if res.get("tierd_cpu_s"):
            tc = res["tierd_cpu_s"]
            s["tierd_cpu_s_per_step"] = r(sum(tc.values()) / a.steps)
            s["tierd_cpu_s_per_step_by_thread"] = {k: r(v / a.steps) for k, v in sorted(tc.items()) if v > 0}
        if not a.sequential and res is not plain:
            # step of this configuration / plain's step of the same round, median over the measured rounds
            pairs = [x / y for x, y in zip(rounds[res["config"]][a.warmup:], rounds["plain"][a.warmup:])]
            s["vs_plain_paired"] = r(statistics.median(pairs), 3) if pairs else None
        return s

    summaries = {c: summary(results[c]) for c in configs}

    # bit for bit: every tier.torch configuration that ran against plain PyTorch
    verified: bool | None = True
    verify: dict[str, dict] = {}
    for c in configs:
        if c == "plain" or not results[c]["fits"]:
            continue
        d = first_difference(results[c]["losses"], plain["losses"])
        same_params = results[c].get("params_sha256") == plain.get("params_sha256")
        verify[c] = {"losses_equal": d is None, "first_differing_step": d, "params_equal": same_params}
        verified = verified and d is None and same_params
    if not verify:
        verified = None             # no tier.torch configuration ran to the end: nothing verified

    def step_of(c: str) -> float | None:
        s = summaries.get(c)
        return s["step_s"] if s and s["fits"] else None

    fit_step = step_of("fit")
    off_step = step_of("C")
    bound = nvme_s = link_s = None
    if off_step is not None:
        mv = results["C"]["moved_per_step"]
        nvme_s = mv["nvme->host"] / fio_r + mv["host->nvme"] / fio_w
        link_s = (mv["host->vram"] + mv["vram->host"]) / link_bw if link_bw else 0.0
        bound = max(plain_step, nvme_s, link_s)

    out = {
        "bench": "torch",
        "plain_step_s": r(plain_step), "fit_step_s": fit_step, "offload_step_s": off_step,
        "offload_lower_bound_s": r(bound),
        "fit_vs_plain": r(fit_step / plain_step, 3) if fit_step else None,
        "offload_vs_bound": r(off_step / bound, 3) if off_step and bound else None,
        "verified": verified,
        "plain_tokens_per_s": r(tokens / plain_step, 1),
        "fit_tokens_per_s": summaries["fit"]["tokens_per_s"] if "fit" in summaries else None,
        "offload_tokens_per_s": summaries["C"]["tokens_per_s"] if "C" in summaries else None,
        "bound_parts_s": {"compute": r(plain_step), "nvme": r(nvme_s), "link": r(link_s)},
        "model": {"name": "GPT2LMHeadModel" if a.model == "gpt2" else "ByteLM",
                  "dim": 768 if a.model == "gpt2" else a.dim, "layers": 12 if a.model == "gpt2" else a.layers,
                  "heads": 12 if a.model == "gpt2" else a.heads, "context": a.context,
                  "batch": a.batch, "params": sz["params"], "blocks": sz["blocks"],
                  "param_bytes": sz["param_bytes"], "state_bytes": sz["state_bytes"],
                  "block_bytes_max": sz["block_bytes_max"], "tokens_per_step": tokens},
        "budgets": {"fit": {"host": fit_limit, "vram": fit_limit}, "tight": {"host": host_tight, "vram": vram_tight}},
        "fio_read_gbps": r(fio_r / GB), "fio_write_gbps": r(fio_w / GB),
        "fio_bs": FIO_BS, "fio_iodepth": a.queue_depth, "fio_fixedbufs": True, "fio_registerfiles": True,
        "link_baseline": link_kind, "link_gbps": r(link_bw / GB) if link_bw else None,
        "vram_backend": backend,
        "mode": "sequential" if a.sequential else "interleaved",
        "placements": {c: summaries[c] for c in ("A", "B", "C") if c in summaries},
        "fit": summaries.get("fit"), "plain": summaries["plain"],
        "verify": verify,
        # VmHWM reset (clear_refs) before each configuration: per configuration in sequential mode only
        "tierd_hwm_per_config": hwm_reset and a.sequential,
        "accumulate": a.accumulate, "clip": a.clip,
        "steps": a.steps, "warmup": a.warmup, "threads": torch.get_num_threads() if not a.threads else a.threads,
        "cpus": os.cpu_count(),
        # status round trips every 50 ms while the configurations ran (tierd's loop latency under load)
        "status_n": len(status_rtt),
        "status_p99_ms": r(sorted(status_rtt)[max(0, -(-99 * len(status_rtt) // 100) - 1)] * 1e3, 2)
        if status_rtt else None,
        "status_max_ms": r(max(status_rtt) * 1e3, 2) if status_rtt else None,
        "tierd_stuck_after": stuck,
        "runtime_s": r(time.monotonic() - t_start, 1),
    }
    print_table(out, summaries, configs)
    print(json.dumps(out, separators=(",", ":")), flush=True)      # one line, as the other benchmarks
    return 0


def print_table(out: dict, summaries: dict, configs: list[str]) -> None:
    m = out["model"]
    lines = [
        f"{m['name']} {m['params'] / 1e6:.2f} M parameters, state {m['state_bytes'] / MIB:.1f} MiB; "
        f"{out['steps']} measured steps after {out['warmup']}, {out['mode']}; budgets fit host=vram "
        f"{out['budgets']['fit']['host'] / MIB:.0f} MiB, tight host {out['budgets']['tight']['host'] / MIB:.0f} MiB "
        f"vram {out['budgets']['tight']['vram'] / MIB:.0f} MiB",
        f"baselines: fio read {out['fio_read_gbps']} GB/s, write {out['fio_write_gbps']} GB/s; "
        f"link {out['link_gbps']} GB/s ({out['link_baseline']})",
        f"{'config':<10}{'fits':>5}{'step s':>9}{'tok/s':>9}{'busy':>7}{'rss MiB':>9}{'tierd hwm':>11}"
        f"{'shmem':>8}{'rd GB/st':>10}{'wr GB/st':>10}{'other cpu':>10}{'x plain':>9}{'tierd cpu/st':>13}",
    ]
    names = {"plain": "plain", "fit": "fit (A)", "A": "A tight", "B": "B tight", "C": "C tight"}
    for c in configs:
        s = summaries[c]

        def f(v, fmt):
            return format(v, fmt) if v is not None else "-"

        lines.append(f"{names[c]:<10}{'yes' if s['fits'] else 'NO':>5}{f(s['step_s'], '.3f'):>9}"
                     f"{f(s['tokens_per_s'], '.0f'):>9}{f(s.get('busy'), '.3f'):>7}"
                     f"{f(s['rss_peak_bytes'] and s['rss_peak_bytes'] / MIB, '.0f'):>9}"
                     f"{f(s['tierd_hwm_bytes'] and s['tierd_hwm_bytes'] / MIB, '.0f'):>11}"
                     f"{f(s['tierd_shmem_bytes'] and s['tierd_shmem_bytes'] / MIB, '.0f'):>8}"
                     f"{f(s['nvme_read_gb_per_step'], '.4f'):>10}{f(s['nvme_write_gb_per_step'], '.4f'):>10}"
                     f"{f(s['cpus_busy'].get('other'), '.2f'):>10}{f(s.get('vs_plain_paired'), '.3f'):>9}"
                     f"{f(s.get('tierd_cpu_s_per_step'), '.3f'):>13}")
        if not s["fits"]:
            lines.append(f"    {s['error']}")
    if out.get("status_n"):
        lines.append(f"tierctl status round trips meanwhile: {out['status_n']}, p99 {out['status_p99_ms']} ms, "
                     f"max {out['status_max_ms']} ms")
    busy_other = [c for c in configs if summaries[c]["cpus_busy"].get("other", 0) > 0.2]
    if busy_other:
        lines.append(f"note: other processes kept {max(summaries[c]['cpus_busy']['other'] for c in busy_other):.2f} "
                     f"CPUs busy during {', '.join(busy_other)}: those figures are not the configuration's own")
    if out["tierd_stuck_after"]:
        lines.append(f"tierd stopped answering during configuration {out['tierd_stuck_after']}: the tier.torch "
                     "configurations after it did not run to the end")
    paired = {c: summaries[c].get("vs_plain_paired") for c in configs if summaries[c].get("vs_plain_paired")}
    if paired:
        lines.append("paired with plain's step of the same round (median of the ratios): "
                     + ", ".join(f"{names[c]} {v}" for c, v in paired.items()))
    lines.append(f"fit/plain {out['fit_vs_plain']} (goal <= 1.10); offload/bound {out['offload_vs_bound']} "
                 f"(goal <= 1.25; bound {out['offload_lower_bound_s']} s = max{out['bound_parts_s']}); "
                 f"verified {out['verified']}")
    print("\n".join(lines), file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    if a.sizes:
        sz = model_sizes(make_model(a))
        print(sz["state_bytes"], sz["block_bytes_max"], *budgets(a, sz))
        return 0
    if a.child:
        return child(a)
    return parent(a)


if __name__ == "__main__":
    sys.exit(main())
