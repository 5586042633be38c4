#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""bench/matrix_table.py LINES SECONDS LOADAVG CPUS: bench/run timeline --matrix's JSON lines as a markdown table."""

import json
import sys


def f(v, fmt="{:.3f}"):
    return "-" if v is None else fmt.format(v)


def main() -> int:
    path, seconds, load, cpus = sys.argv[1:5]
    rows: dict[str, dict[str, dict]] = {}
    skipped: dict[str, str] = {}
    for line in open(path):
        line = line.strip()
        if line:
            d = json.loads(line)
            if "skipped" in d:
                skipped[d["case"]] = d["skipped"]
            else:
                rows.setdefault(d["case"], {})[d["policy"]] = d
    print(f"Measured by `bench/run timeline --matrix` in {seconds} s; load average at the end {load} on "
          f"{cpus} CPUs. step and bounds in seconds, bytes in GB per step (all jobs). \"least found\" "
          "(capacity_bound_s) is the step time of the fewest bytes the model's heuristic found, not a lower "
          "bound; \"floor\" and \"time bound\" are lower bounds.\n")
    print("| case | jobs | compute asked / measured | least found (floor) | time bound | held-2 bound "
          "| planned step (held 1 / 2) | timeline step "
          "| x least | x time | x held-2 | x planned | lru step | x least | ondemand step | x least "
          "| NVMe GB timeline / lru / ondemand / least / least held-2 | stall timeline | lower_bound_s timeline "
          "| verified |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for case, pols in rows.items():
        any_d = next(iter(pols.values()))
        t = pols.get("timeline")
        # the compute asked for (the busy loops), as bench-timeline reports it
        asked = t.get("compute_asked_s") if t else None
        cells = [case, str(any_d.get("jobs", 1)), f(asked) + " / " + f(t and t["compute_s"]),
                 f(any_d.get("capacity_bound_s")) + " (" + f(any_d.get("capacity_floor_s")) + ")",
                 f(any_d.get("time_bound_s")), f(any_d.get("held2_bound_s")),
                 f(t and t.get("planned_s")) + " / " + f(t and t.get("planned_held2_s"))]
        nv = []
        for pol in ("timeline", "lru", "ondemand"):
            d = pols.get(pol)
            cells += [f(d and d["step_s"]), f(d and d.get("ratio_capacity"), "{:.2f}")]
            if pol == "timeline":
                cells.append(f(d and d.get("ratio_time"), "{:.2f}"))
                held = d and d.get("held2_bound_s")
                cells.append(f(d and held and d["step_s"] / held, "{:.2f}"))
                cells.append(f(d and d.get("ratio_planned"), "{:.2f}"))
            nv.append(f(d and d["nvme_read_gb"] + d["nvme_write_gb"]))
        nv.append(f(any_d.get("min_nvme_read_gb", 0) + any_d.get("min_nvme_write_gb", 0)))
        nv.append(f(any_d.get("min_held2_nvme_gb")))
        cells += [" / ".join(nv), f(t and t["stall_s"]), f(t and t["lower_bound_s"]),
                  "yes" if all(d["verified"] for d in pols.values()) else "NO"]
        print("| " + " | ".join(cells) + " |")
    for case, why in skipped.items():
        print(f"\n{case}: skipped ({why}).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
