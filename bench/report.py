#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""bench/report.py: run every benchmark, write one results JSON, a markdown summary and PNG plots.

`bench/run all` runs this.  Each benchmark kind runs through `bench/run KIND` (a fresh
tierd each); the storage sweep runs `tierctl bench` on the benchmark directory.  The
JSON lines they print are collected into RESULTS/results.json; RESULTS/summary.md
holds a table per benchmark with its baseline from the same run, and gnuplot (Debian's
gnuplot-nox) renders RESULTS/storage-sweep.png (GB/s vs queue depth per block size)
and RESULTS/timeline.png (step time per policy against its bounds).

`--from RESULTS.json` renders the summary and plots again from an earlier results
file without running anything.
"""

import argparse
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KINDS = ("io", "ipc", "timeline", "torch", "share", "storage")
# The rows of bench/run timeline --matrix (bench/run's run_matrix()) and the policies each runs under.
MATRIX_CASES = tuple(f"L{n}-r{r}-j{j}" for j in (1, 2) for n in (8, 12, 16) for r in ("0.5", "1", "2")) + ("torch-lm",)
MATRIX_POLICIES = ("timeline", "lru", "ondemand")


def log(msg):
    print(f"bench/run all: {msg}", file=sys.stderr, flush=True)


def parse_args(argv):
    ap = argparse.ArgumentParser(
        prog="bench/run all",
        description="Run every benchmark; write results.json, summary.md and PNG plots.",
        epilog="Options after -- go to every bench/run call.  Without gnuplot the plots are skipped (with a warning); ./scripts/test installs gnuplot-nox.")
    ap.add_argument("--out", metavar="DIR",
                    help="where results go (default: bench/results/YYYYmmdd-HHMMSS)")
    ap.add_argument("--kinds", default=",".join(KINDS), metavar="LIST",
                    help=f"comma-separated subset of {','.join(KINDS)} (default: all)")
    ap.add_argument("--dir", default="/var/tmp", metavar="DIR",
                    help="filesystem the benchmarks run on (bench/run --dir; tierctl bench's scratch)")
    ap.add_argument("--storage-size", default="256M", metavar="SIZE",
                    help="tierctl bench --size (default 256M)")
    ap.add_argument("--quick", action="store_true",
                    help="small sizes and few steps everywhere (a smoke run, not a measurement)")
    ap.add_argument("--matrix", action="store_true",
                    help="also run bench/run timeline --matrix (minutes)")
    ap.add_argument("--from", dest="from_file", metavar="RESULTS.json",
                    help="render summary.md and the plots from this file; run nothing")
    ap.add_argument("--no-plots", action="store_true", help="do not run gnuplot")
    passthrough = []
    if "--" in argv:
        i = argv.index("--")
        argv, passthrough = argv[:i], argv[i + 1:]
    args = ap.parse_args(argv)
    args.passthrough = passthrough
    kinds = [k for k in args.kinds.split(",") if k]
    for k in kinds:
        if k not in KINDS:
            ap.error(f'unknown benchmark "{k}" in --kinds (one of {", ".join(KINDS)})')
    args.kinds = kinds
    return args


def json_lines(text):
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    return out


def option_value(argv, name):
    """The value of option @name (--name VALUE or --name=VALUE) in @argv, the last one given; None if absent."""
    value = None
    for i, a in enumerate(argv):
        if a == name and i + 1 < len(argv):
            value = argv[i + 1]
        elif a.startswith(name + "="):
            value = a[len(name) + 1:]
    return value


def matrix_check(lines, cases=None, policies=None):
    """(missing, skipped) of bench/run timeline --matrix's JSON lines: "CASE/POLICY" of every row expected
    (@cases x @policies, by default all of them) that printed no line, and {case: why} of the rows that
    printed {"case": .., "skipped": why} instead."""
    skipped = {d["case"]: d["skipped"] for d in lines if "skipped" in d and "case" in d}
    have = {(d.get("case"), d.get("policy")) for d in lines if "skipped" not in d}
    missing = [f"{c}/{p}" for c in (cases or MATRIX_CASES) if c not in skipped
               for p in (policies or MATRIX_POLICIES) if (c, p) not in have]
    return missing, skipped


def run_capture(cmd, what):
    """Run cmd; stderr passes through; returns (rc, JSON objects printed on stdout)."""
    log(f"{what}: {' '.join(cmd)}")
    t0 = time.monotonic()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=False)
    log(f"{what}: exit {p.returncode} after {time.monotonic() - t0:.0f} s")
    return p.returncode, json_lines(p.stdout)


def build_dir():
    return os.environ.get("TIER_BUILD", os.path.join(ROOT, "build"))


def run_all(args):
    results = {"kind": "tierd-bench-results", "version": 1,
               "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               "host": host_info(), "options": {"dir": args.dir, "quick": args.quick, "matrix": args.matrix},
               "results": {}, "failed": {}, "skipped": {}}
    run = os.path.join(ROOT, "bench", "run")
    quick = {
        "io": ["--total", "128M", "--repeat", "1"],
        "ipc": ["--iterations", "2000", "--duration", "1"],
        "timeline": ["--steps", "3", "--warmup", "1", "--duration", "4"],
        "torch": ["--steps", "3", "--warmup", "1", "--fio-size", "128M"],
        "share": ["--duration", "3"],
    }
    for k in args.kinds:
        if k == "storage":
            continue
        cmd = [run, k, "--dir", args.dir] + (quick.get(k, []) if args.quick else []) + args.passthrough
        rc, lines = run_capture(cmd, k)
        results["results"][k] = lines
        if rc == 77:
            # bench/run's skip (torch without torch and numpy): its reason is on stderr above
            results["skipped"][k] = f"bench/run {k} exited with status 77: a prerequisite is missing (see its message)"
        elif rc != 0 or not lines:
            results["failed"][k] = f"bench/run {k} exited with status {rc}" if rc else "no JSON line"
    if args.matrix:
        cmd = [run, "timeline", "--matrix", "--dir", args.dir] + (quick["timeline"] if args.quick else []) + \
            args.passthrough
        rc, lines = run_capture(cmd, "timeline matrix")
        results["results"]["matrix"] = [d for d in lines if "skipped" not in d]
        cases, configs = option_value(args.passthrough, "--matrix-cases"), option_value(args.passthrough, "--configs")
        missing, skipped = matrix_check(lines, cases.split(",") if cases else None,
                                        configs.split(",") if configs else None)
        for case, why in skipped.items():
            results["skipped"][f"matrix {case}"] = why
        if rc != 0 or not lines:
            results["failed"]["matrix"] = f"bench/run timeline --matrix exited with status {rc}" if rc else "no JSON line"
        elif missing:
            results["failed"]["matrix"] = f"{len(missing)} row(s) printed nothing: {', '.join(missing)}"
    if "storage" in args.kinds:
        tierctl = os.path.join(build_dir(), "client", "tierctl")
        scratch = tempfile.mkdtemp(prefix="tierd-storage-", dir=args.dir)
        try:
            size = "32M" if args.quick else args.storage_size
            cmd = [tierctl, "bench", "--json", "--size", size, "--save", os.path.join(scratch, "bench.json")]
            if args.quick:
                cmd += ["--bs", "128K,1M", "--qd", "1,8", "--sustain", "0"]
            rc, lines = run_capture(cmd + [scratch], "storage")
            if rc == 0 and lines:
                results["results"]["storage"] = lines[-1]
            else:
                results["failed"]["storage"] = f"tierctl bench exited with status {rc}" if rc else "no JSON"
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    return results


def host_info():
    info = {"kernel": platform.release(), "cpus": os.cpu_count()}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    info["cpu"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        rev = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             check=False)
        if rev.returncode == 0:
            info["commit"] = rev.stdout.strip()
    except OSError:
        pass
    return info


# ---- summary ---------------------------------------------------------------------------------------------------

def fmt(v, digits=3):
    if v is None:
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "**no**"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def table(head, rows):
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(fmt(c) for c in r) + " |" for r in rows]
    return out


def summary(results):
    r = results.get("results", {})
    host = results.get("host", {})
    md = ["# tierd benchmark results", "",
          f"{results.get('time', '?')}, commit {host.get('commit', '?')}, {host.get('cpus', '?')} CPUs "
          f"({host.get('cpu', 'unknown CPU')}), kernel {host.get('kernel', '?')}.",
          "Every figure has its baseline from the same run beside it (bench/README.md explains each).", ""]
    for k, why in sorted(results.get("failed", {}).items()):
        md.append(f"* **{k} failed:** {why}")
    for k, why in sorted(results.get("skipped", {}).items()):
        md.append(f"* **{k} skipped:** {why}")
    if results.get("failed") or results.get("skipped"):
        md.append("")
    for line in r.get("io", []):
        md += ["## NVMe tier vs fio (bench-io)", ""]
        md += table(["", "tierd GB/s", "fio GB/s", "tierd / fio"],
                    [["write", line.get("write_gbps"), line.get("fio_write_gbps"), line.get("write_ratio")],
                     ["read", line.get("read_gbps"), line.get("fio_read_gbps"), line.get("read_ratio")]])
        md += ["", f"verified: {fmt(line.get('verified'))}", ""]
    for line in r.get("ipc", []):
        md += ["## Requests vs a raw socket (bench-ipc)", ""]
        md += table(["", "tierd", "raw socket", "ratio"],
                    [["round trip p50 (µs)", line.get("pin_rtt_us_p50"), line.get("raw_rtt_us_p50"),
                      line.get("pin_vs_raw")],
                     ["ops/s pipelined", line.get("ops_per_s"), line.get("raw_ops_per_s"), line.get("ops_vs_raw")]])
        md.append("")
    tl = [x for x in r.get("timeline", []) if "step_s" in x]
    if tl:
        md += ["## Timeline: step time vs its lower bound (bench-timeline)", ""]
        md += ["\"least found\" (capacity_bound_s) is the step of the fewest bytes the model's heuristic "
               "found, not a lower bound; \"time bound\" (time_bound_s) is one.", ""]
        md += table(["policy", "step s", "bound s", "time bound s", "least found s", "step / bound", "NVMe GB/step",
                     "stall s", "verified"],
                    [[x.get("policy"), x.get("step_s"), x.get("lower_bound_s"), x.get("time_bound_s"),
                      x.get("capacity_bound_s"), x.get("ratio"), (x.get("nvme_read_gb") or 0) + (x.get("nvme_write_gb") or 0),
                      x.get("stall_s"), x.get("verified")] for x in tl])
        md.append("")
    for x in r.get("timeline", []):
        if "jain" in x:
            md += [f"Fair share, {x.get('jobs')} jobs weighted {x.get('weights')}: Jain's index "
                   f"{fmt(x.get('jain'))}, aggregate NVMe {fmt(x.get('aggregate_nvme_gbps'))} GB/s vs one job "
                   f"alone {fmt(x.get('solo_nvme_gbps'))} GB/s, verified {fmt(x.get('verified'))}.", ""]
    mx = r.get("matrix", [])
    if mx:
        md += ["## Timeline matrix", ""]
        md += table(["case", "policy", "step s", "time bound s", "step / time bound", "least found s",
                     "NVMe GB/step", "verified"],
                    [[x.get("case"), x.get("policy"), x.get("step_s"), x.get("time_bound_s"),
                      x.get("ratio_time"), x.get("capacity_bound_s"),
                      (x.get("nvme_read_gb") or 0) + (x.get("nvme_write_gb") or 0), x.get("verified")]
                     for x in mx])
        md.append("")
    for line in r.get("torch", []):
        md += ["## PyTorch through tier.torch (bench_torch.py)", ""]
        md += table(["", "step s", "baseline", "ratio"],
                    [["fits in budget vs plain PyTorch", line.get("fit_step_s"), line.get("plain_step_s"),
                      line.get("fit_vs_plain")],
                     ["offloaded (C) vs its lower bound", line.get("offload_step_s"),
                      line.get("offload_lower_bound_s"), line.get("offload_vs_bound")]])
        md += ["", f"verified: {fmt(line.get('verified'))}", ""]
    for line in r.get("share", []):
        md += ["## Sharing the host pool (bench_share.py)", ""]

        def job_per_step(run, job):
            return ((line.get(run) or {}).get(job) or {}).get("nvme_bytes_per_step")
        md += table(["", "NVMe bytes per step (both)", "big job", "small job"],
                    [["static halves", line.get("nvme_bytes_per_step_static"), job_per_step("static", "big"),
                      job_per_step("static", "small")],
                     ["capacity that flows", line.get("nvme_bytes_per_step_flowing"), job_per_step("flowing", "big"),
                      job_per_step("flowing", "small")]])
        md += ["", f"Jain's index (second half): {fmt(line.get('jain_second_half_mean'))}, "
               f"verified: {fmt(line.get('verified'))}", ""]
    st = r.get("storage")
    if st:
        md += ["## Storage sweep (tierctl bench)", ""]
        best = st.get("best", {})
        fio = st.get("fio") or {}
        rows = []
        for op in ("read", "write"):
            b = best.get(op) or {}
            rows.append([op, b.get("target"), b.get("bs"), b.get("qd"), b.get("gbps"), fio.get(f"{op}_gbps")])
        md += table(["", "target", "block", "queue depth", "best GB/s", "fio GB/s (same setting)"], rows)
        sus = [c for c in st.get("cells", []) if c.get("suspect")]
        md += ["", f"{len(st.get('cells', []))} cells, {len(sus)} above the link speed (suspect).", ""]
    plots = results.get("plots", [])
    if plots:
        md += ["## Plots", ""] + [f"![{os.path.splitext(p)[0]}]({p})" for p in plots] + [""]
    return "\n".join(md)


# ---- plots -----------------------------------------------------------------------------------------------------

def gnuplot(script, what):
    exe = shutil.which("gnuplot")
    if not exe:
        log(f"warning: gnuplot is not installed, no {what} plot (apt-get install gnuplot-nox)")
        return False
    p = subprocess.run([exe], input=script, text=True, capture_output=True, check=False)
    if p.returncode != 0:
        log(f"warning: gnuplot failed on the {what} plot: {p.stderr.strip()}")
        return False
    return True


def plot_storage(st, out):
    """GB/s vs queue depth, one line per block size; read and write side by side (striped, or the one target)."""
    cells = st.get("cells", [])
    targets = {c.get("target") for c in cells}
    target = "striped" if "striped" in targets else (sorted(targets)[0] if targets else None)
    if target is None:
        return None
    datafile = os.path.join(out, "storage-sweep.dat")
    blocks = sorted({c["bs"] for c in cells if c.get("target") == target})
    index = 0
    plots = {"read": [], "write": []}
    with open(datafile, "w") as f:
        for op in ("read", "write"):
            for bs in blocks:
                pts = sorted((c["qd"], c["gbps"]) for c in cells
                             if c.get("target") == target and c.get("op") == op and c.get("bs") == bs)
                if not pts:
                    continue
                f.write(f"# {op} bs={bs}\n")
                for qd, g in pts:
                    f.write(f"{qd} {g}\n")
                f.write("\n\n")
                label = f"{bs >> 20}M" if bs >= 1 << 20 else f"{bs >> 10}K"
                plots[op].append(f"'{datafile}' index {index} with linespoints title '{label}'")
                index += 1
    png = os.path.join(out, "storage-sweep.png")
    script = [f"set terminal pngcairo size 1200,450 noenhanced" if has_cairo() else
              "set terminal png size 1200,450 noenhanced",
              f"set output '{png}'", "set multiplot layout 1,2",
              "set logscale x 2", "set xlabel 'queue depth'", "set ylabel 'GB/s'", "set grid",
              "set key outside right top title 'block'"]
    for op in ("read", "write"):
        if plots[op]:
            script += [f"set title 'tierctl bench {op}, {target} (O_DIRECT, io_uring)'",
                       "plot " + ", ".join(plots[op])]
    script.append("unset multiplot")
    return "storage-sweep.png" if gnuplot("\n".join(script) + "\n", "storage sweep") else None


_cairo = None


def has_cairo():
    global _cairo
    if _cairo is None:
        exe = shutil.which("gnuplot")
        _cairo = False
        if exe:
            p = subprocess.run([exe, "-e", "set terminal"], capture_output=True, text=True, check=False)
            _cairo = "pngcairo" in (p.stdout + p.stderr)
    return _cairo


def plot_timeline(rows, out, name, title):
    """Step time per policy (or per case and policy) beside its lower bound(s): a clustered histogram."""
    rows = [x for x in rows if x.get("step_s")]
    if not rows:
        return None
    datafile = os.path.join(out, f"{name}.dat")
    with open(datafile, "w") as f:
        f.write("# label step lower_bound time_bound least_found\n")
        for x in rows:
            label = f"{x['case']}/{x['policy']}" if x.get("case") else x.get("policy", "?")
            tb, cap = x.get("time_bound_s"), x.get("capacity_bound_s")
            f.write(f"\"{label}\" {x['step_s']} {x.get('lower_bound_s') or 0} "
                    f"{tb if tb is not None else 'NaN'} {cap if cap is not None else 'NaN'}\n")
    png = os.path.join(out, f"{name}.png")
    width = max(800, 70 * len(rows))
    term = "pngcairo" if has_cairo() else "png"
    script = [f"set terminal {term} size {width},450 noenhanced", f"set output '{png}'",
              f"set title '{title}'", "set style data histogram", "set style histogram clustered gap 1",
              "set style fill solid 0.8 border -1", "set ylabel 'seconds per step'", "set grid ytics",
              "set xtics rotate by -30", "set key left top", "set yrange [0:*]",
              f"plot '{datafile}' using 2:xtic(1) title 'step', '' using 3 title 'bound (bytes moved)', "
              "'' using 4 title 'time-aware lower bound', '' using 5 title 'least found (not a bound)'"]
    return f"{name}.png" if gnuplot("\n".join(script) + "\n", name) else None


def render(results, out, plots):
    results["plots"] = []
    if plots:
        st = results.get("results", {}).get("storage")
        if st:
            p = plot_storage(st, out)
            if p:
                results["plots"].append(p)
        tl = [x for x in results.get("results", {}).get("timeline", []) if "step_s" in x]
        p = plot_timeline(tl, out, "timeline", "bench-timeline: step time per policy vs its lower bounds")
        if p:
            results["plots"].append(p)
        mx = results.get("results", {}).get("matrix", [])
        p = plot_timeline(mx, out, "timeline-matrix", "timeline matrix: step time vs bounds")
        if p:
            results["plots"].append(p)
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
        f.write("\n")
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write(summary(results))


def main(argv):
    args = parse_args(argv)
    if args.from_file:
        try:
            with open(args.from_file) as f:
                results = json.load(f)
        except (OSError, json.JSONDecodeError) as e:
            print(f"bench/run all: cannot read {args.from_file}: {e}", file=sys.stderr)
            return 2
        if not isinstance(results, dict) or results.get("kind") != "tierd-bench-results":
            print(f"bench/run all: {args.from_file} is not a results file of bench/run all", file=sys.stderr)
            return 2
        out = args.out or os.path.dirname(os.path.abspath(args.from_file))
    else:
        results = run_all(args)
        out = args.out or os.path.join(ROOT, "bench", "results",
                                       datetime.datetime.now().strftime("%Y%m%d-%H%M%S"))
    os.makedirs(out, exist_ok=True)
    render(results, out, not args.no_plots)
    log(f"wrote {out}/results.json, {out}/summary.md" +
        "".join(f", {out}/{p}" for p in results.get("plots", [])))
    return 1 if results.get("failed") else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
