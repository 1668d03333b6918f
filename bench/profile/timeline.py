#!/usr/bin/env python3
"""Where a training step's time goes, from kshard_trace's files (GPU timestamps, not replays).

    CUDA_INJECTION64_PATH=build/cuda/bench/profile/libkshard_trace.so KSHARD_TRACE_OUT=k-%p.tsv \\
        mpiexec -n 1 -x CUDA_INJECTION64_PATH -x KSHARD_TRACE_OUT \\
        build/cuda/examples/train/kshard-train --bench ...
    (%p: the process id; under mpiexec, Open MPI's own CUDA initialisation writes a trace
    of its own, empty; take the largest file.)
    CUDA_INJECTION64_PATH=... KSHARD_TRACE_OUT=t.tsv python3 bench/fsdp2/fsdp2_twin.py ...
    python3 bench/profile/timeline.py k.tsv t.tsv --labels kshard,compile [--json out.json]

For each file: the steps (told apart as in ncu_step_breakdown.py: a run of optimizer update
kernels ends a step), and over the steady steps (the first --skip are left out) the median of
  - wall: from the end of the previous step's last update kernel to the end of this one's;
  - busy: the union of kernel / memcpy / memset intervals (several streams count once);
  - idle = wall - busy: the GPU waited for the host;
  - kernel time per category (ncu_step_breakdown.CATEGORIES; overlapping kernels both count).
Then the longest idle gaps of one steady step, each with the activity before and after it and
the host's waits during it (or the host call in progress when the GPU ran dry) (a synchronize, a blocking copy, a
launch): that names the wait. Categories of several files are printed side by side.
"""
import argparse
import json
import os
import statistics
import sys
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ncu_step_breakdown import category  # noqa: E402

UPDATE = "FusedAdam update"
DEVICE_KINDS = {"kernel", "memcpy", "memset"}


def readable(name):
    """A name the demangler gave up on (nvcc's mangling of a lambda inside a Kokkos launch
    template) as the source identifiers it is built of, joined by "::" (enough for the
    categories: "...for_each_index::detail::swiglu_forward::bfloat16_t...")."""
    if not name.startswith("_Z"):
        return name
    out, i = [], 2
    while i < len(name):
        # Digits after S or T are a substitution or template parameter index, not a length.
        if name[i].isdigit() and not name[i - 1].isdigit() and name[i - 1] not in "ST":
            j = i
            while j < len(name) and name[j].isdigit():
                j += 1
            n = int(name[i:j])
            ident = name[j:j + n]
            if n > 0 and len(ident) == n and (ident[0].isalpha() or ident[0] == "_"):
                out.append(ident)
                i = j + n
                continue
        i += 1
    return "::".join(out) or name


def read(path):
    dev, host = [], []
    with open(path) as f:
        header = f.readline()
        if not header.startswith("kind\t"):
            sys.exit(f"{path}: not a kshard_trace file")
        for ln in f:
            kind, s, e, where, corr, nbytes, name = ln.rstrip("\n").split("\t", 6)
            if kind == "kernel":
                name = readable(name)
            r = (int(s), int(e), kind, int(where), int(corr), int(nbytes), name)
            (dev if kind in DEVICE_KINDS else host).append(r)
    dev.sort()
    host.sort()
    return dev, host


def steps_of(dev):
    """[(lo, hi)] index ranges of dev, one per step (the last one ends with its updates)."""
    kern = [i for i, r in enumerate(dev) if r[2] == "kernel"]
    cats = {i: category(dev[i][6]) for i in kern}
    ends = []
    for j, i in enumerate(kern):
        if cats[i] != UPDATE:
            continue
        nxt = kern[j + 1] if j + 1 < len(kern) else None
        if nxt is None or cats[nxt] != UPDATE:
            ends.append(i)
    out, lo = [], 0
    for e in ends:
        out.append((lo, e + 1))
        lo = e + 1
    return out


def union_ns(intervals):
    total, cur_s, cur_e = 0, None, None
    for s, e in sorted(intervals):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total


def gaps_of(acts, t0, t1):
    """Idle intervals of the device inside [t0, t1] given its activities (sorted by start)."""
    gaps, busy_to, prev = [], t0, None
    for r in acts:
        if r[0] > busy_to:
            gaps.append((busy_to, r[0], prev, r))
        if r[1] > busy_to:
            busy_to, prev = r[1], r
    if t1 > busy_to:
        gaps.append((busy_to, t1, prev, None))
    return gaps


WAIT_HINTS = ("Synchronize", "Memcpy", "memcpy", "EventQuery", "StreamQuery", "cuMemAlloc",
              "cudaMalloc", "cudaFree", "cuMemFree", "HostAlloc", "Sync")


def host_during(host, s, e):
    """The host's waits (synchronize, blocking copy, allocation) overlapping [s, e], else the
    calls running at s (innermost last)."""
    waits = [r for r in host if r[0] < e and r[1] > s and any(h in r[6] for h in WAIT_HINTS)]
    return waits or [r for r in host if r[0] <= s <= r[1]]


def short_kernel(name, n=110):
    """A kernel's name without the namespaces and launch wrappers that every kshard / Kokkos
    kernel shares (what tells two kernels apart), cut to n characters."""
    for noise in ("Kokkos::Impl::cuda_parallel_launch_local_memory", "Kokkos::Impl::",
                  "kshard::", "detail::", "(anonymous namespace)::", "compat::", "void "):
        name = name.replace(noise, "")
    return name[:n]


def short(name, n=90):
    return name if len(name) <= n else name[: n - 3] + "..."


def analyse(path, skip, top, gap_us):
    dev, host = read(path)
    steps = steps_of(dev)
    if len(steps) <= skip:
        sys.exit(f"{path}: {len(steps)} steps found (update-kernel runs), --skip {skip}")
    launch_of = {r[4]: r for r in host if r[2] in ("runtime", "driver")}
    rows = []
    for k, (lo, hi) in enumerate(steps):
        if k < skip or k == 0:
            continue
        t0 = dev[steps[k - 1][1] - 1][1]  # end of the previous step's last update kernel
        t1 = dev[hi - 1][1]
        acts = [r for r in dev[lo:hi]]
        busy = union_ns([(max(r[0], t0), r[1]) for r in acts if r[1] > t0])
        cats = defaultdict(lambda: [0.0, 0])
        names = defaultdict(lambda: [0.0, 0])
        for r in acts:
            if r[2] == "kernel":
                nm = names[short_kernel(r[6])]
                nm[0] += (r[1] - r[0]) * 1e-6
                nm[1] += 1
            if r[2] == "kernel":
                c = cats[category(r[6])]
            else:
                c = cats[r[6] if r[2] == "memset" else "memcpy"]
            c[0] += (r[1] - r[0]) * 1e-6
            c[1] += 1
        rows.append({"step": k + 1, "wall_ms": (t1 - t0) * 1e-6, "busy_ms": busy * 1e-6,
                     "kernels": sum(1 for r in acts if r[2] == "kernel"),
                     "cats": {c: v for c, v in cats.items()}, "names": dict(names), "t0": t0, "t1": t1, "lo": lo,
                     "hi": hi})
    if not rows:
        sys.exit(f"{path}: no steady step after --skip {skip}")
    med = lambda key: statistics.median(r[key] for r in rows)  # noqa: E731
    wall, busy = med("wall_ms"), med("busy_ms")
    allcats = sorted({c for r in rows for c in r["cats"]})
    cat_ms = {c: statistics.median(r["cats"].get(c, [0, 0])[0] for r in rows) for c in allcats}
    cat_n = {c: statistics.median(r["cats"].get(c, [0, 0])[1] for r in rows) for c in allcats}
    allnames = {n for r in rows for n in r["names"]}
    name_ms = {n: statistics.median(r["names"].get(n, [0, 0])[0] for r in rows) for n in allnames}
    name_n = {n: statistics.median(r["names"].get(n, [0, 0])[1] for r in rows) for n in allnames}
    # The gaps of the step nearest the median wall time.
    rep = min(rows, key=lambda r: abs(r["wall_ms"] - wall))
    acts = dev[rep["lo"]:rep["hi"]]
    gaps = [g for g in gaps_of(acts, rep["t0"], rep["t1"]) if g[1] - g[0] >= gap_us * 1e3]
    gaps.sort(key=lambda g: -(g[1] - g[0]))
    described = []
    for s, e, before, after in gaps[:top]:
        waits = host_during(host, s, e)
        lead = ""
        if after is not None and after[4] in launch_of:
            lr = launch_of[after[4]]
            lead = f"{lr[6]} issued {(lr[0] - s) * 1e-3:+.1f} us after the GPU ran dry"
        described.append({
            "us": (e - s) * 1e-3,
            "at_ms": (s - rep["t0"]) * 1e-6,
            "before": short(before[6]) if before else "(step start)",
            "after": short(after[6]) if after else "(step end)",
            "host": [short(w[6], 60) for w in waits[-3:]],
            "launch": lead,
        })
    idle_small = sum(g[1] - g[0] for g in gaps_of(acts, rep["t0"], rep["t1"])
                     if g[1] - g[0] < gap_us * 1e3) * 1e-6
    return {"path": path, "steps": len(rows), "wall_ms": wall, "busy_ms": busy,
            "idle_ms": wall - busy, "kernels": med("kernels"), "cat_ms": cat_ms, "cat_n": cat_n,
            "rep_step": rep["step"], "name_ms": name_ms, "name_n": name_n, "gaps": described, "gaps_total": len(gaps),
            "idle_in_small_gaps_ms": idle_small}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("traces", nargs="+")
    ap.add_argument("--labels", help="comma list, one per trace")
    ap.add_argument("--skip", type=int, default=3, help="steps left out at the start")
    ap.add_argument("--top", type=int, default=12, help="idle gaps to describe")
    ap.add_argument("--gap-us", type=float, default=5.0, help="smallest gap described (us)")
    ap.add_argument("--names", type=int, default=0,
                    help="also list each trace's N kernels with the most time per step")
    ap.add_argument("--json", help="write everything here")
    a = ap.parse_args()
    labels = a.labels.split(",") if a.labels else [os.path.basename(t) for t in a.traces]
    if len(labels) != len(a.traces):
        sys.exit("--labels: one per trace")
    res = [analyse(t, a.skip, a.top, a.gap_us) for t in a.traces]
    for lab, r in zip(labels, res):
        print(f"== {lab} ({r['path']}): {r['steps']} steady steps, medians: wall {r['wall_ms']:.3f} ms, "
              f"GPU busy {r['busy_ms']:.3f} ms, idle {r['idle_ms']:.3f} ms "
              f"({100 * r['idle_ms'] / r['wall_ms']:.1f} %), {r['kernels']:.0f} kernels")
        print(f"   step {r['rep_step']}: {r['gaps_total']} gaps >= {a.gap_us} us, "
              f"{r['idle_in_small_gaps_ms']:.3f} ms idle in smaller ones; the longest:")
        for g in r["gaps"]:
            print(f"   {g['us']:8.1f} us at {g['at_ms']:7.3f} ms  after {g['before']}")
            print(f"   {'':8s}              before {g['after']}")
            if g["host"]:
                print(f"   {'':8s}              host in {' > '.join(g['host'])}")
            if g["launch"]:
                print(f"   {'':8s}              {g['launch']}")
    cats = sorted({c for r in res for c in r["cat_ms"]},
                  key=lambda c: -max(r["cat_ms"].get(c, 0) for r in res))
    print()
    print(f"{'kernel time per step (ms, median)':40s}" + "".join(f"{l[:14]:>16s}" for l in labels))
    for c in cats:
        print(f"{c[:40]:40s}" + "".join(
            f"{r['cat_ms'].get(c, 0):10.3f} ({r['cat_n'].get(c, 0):3.0f})" for r in res))
    for key, name in (("busy_ms", "GPU busy"), ("idle_ms", "GPU idle"), ("wall_ms", "wall")):
        print(f"{name:40s}" + "".join(f"{r[key]:16.3f}" for r in res))
    for lab, r in zip(labels, res):
        if a.names:
            print(f"\n{lab}: kernels by time per step (ms, median; launches)")
            for n, ms in sorted(r["name_ms"].items(), key=lambda kv: -kv[1])[: a.names]:
                print(f"  {ms:8.3f} {r['name_n'][n]:4.0f}x  {n}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(zip(labels, res)), f, indent=1)


if __name__ == "__main__":
    main()
