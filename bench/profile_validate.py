#!/usr/bin/env python3
"""`coordl profile --validate`, optionally with storage throttled: the profiler's acceptance runs.

With ``--throttle-mbps M`` the profile process (and its loader workers, which inherit it) runs
in a blkio cgroup (v1) whose ``blkio.throttle.read_bps_device`` caps reads from the disk that
holds the dataset at M MiB/s (bench/lib/cgroup.py, as bench/minio_vs_pagecache.py does): a
fetch-bound case. Without it, a prep-bound case on this CPU-only machine. Writes OUT.json and
OUT.png from the profiler and OUT.md (command, the profiler's table, the validation lines);
both text files name paths as bench/lib/report.py's `portable` does (no machine path is committed).

    flock /tmp/coordl-bench.lock .venv/bin/python bench/profile_validate.py \\
        --data /work/bench-data/prof --throttle-mbps 20 --out bench/results/profile-throttled
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys

from lib import cgroup, report

MiB = 2**20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--throttle-mbps", type=float, default=0.0, help="storage read limit, MiB/s (0: none)")
    ap.add_argument("--out", required=True, help="writes OUT.json, OUT.png, OUT.md")
    ap.add_argument("profile_args", nargs=argparse.REMAINDER, help="more `coordl profile` arguments after --")
    args = ap.parse_args()
    extra = [a for a in args.profile_args if a != "--"]
    coordl = os.path.join(os.path.dirname(sys.executable), "coordl")
    cmd = [coordl, "profile", "--data", os.path.abspath(args.data), "--validate",
           "--json", args.out + ".json", "--plot", args.out + ".png", *extra]
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    # the result files name the data, the output and the executables portably ($BENCH_DATA, ...)
    subs = {os.path.abspath(args.out): report.portable(args.out, "$OUT_DIR"), coordl: report.portable(coordl),
            os.path.abspath(args.data): report.portable(args.data)}

    def portable(text: str) -> str:
        for path in sorted(subs, key=len, reverse=True):
            text = text.replace(path, subs[path])
        return text

    bench_cmd = "flock $LOCK " + report.command()
    if args.throttle_mbps > 0:
        why = cgroup.why_not("blkio", "blkio.throttle.read_bps_device")
        if why:
            raise SystemExit(f"bench: cannot throttle storage: {why}")
        dev = cgroup.disk_of(os.path.abspath(args.data))
        with cgroup.Cgroup(f"coordl-profile-{os.getpid()}", read_bps=(dev, int(args.throttle_mbps * MiB))) as cg:
            proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True,
                                  preexec_fn=lambda: cgroup.join(cg.procs_files))
        where = f"storage throttled to {args.throttle_mbps:g} MiB/s (blkio, disk {dev})"
    else:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
        where = "storage not throttled"
    sys.stdout.write(proc.stdout)
    if proc.returncode != 0:
        raise SystemExit(f"bench: coordl profile failed (exit {proc.returncode})")
    with open(args.out + ".json") as f:
        text = portable(f.read())
    with open(args.out + ".json", "w") as f:
        f.write(text)
    result = json.loads(text)
    with open(args.out + ".md", "w") as f:
        f.write(f"# coordl profile --validate, {where}\n\nCommand ($LOCK: the bench lock file):\n\n"
                f"    {bench_cmd}\n\nwhich runs\n\n    {portable(' '.join(shlex.quote(c) for c in cmd))}\n\n"
                f"```\n{portable(proc.stdout)}```\n\n")
        f.write("| validated config | predicted samples/s | measured samples/s | error |\n|---|---|---|---|\n")
        for v in result["validation"]:
            c = v["config"]
            f.write(f"| {c['cache_fraction']:.0%} cached, {c['workers']} workers | {v['predicted']:.1f} "
                    f"| {v['measured']:.1f} | {v['error_pct']:+.1f}% |\n")
    with open(args.out + ".md") as f:
        bad = sorted(set(report.leaks(text + f.read())))
    if bad:
        print(f"bench: warning: {args.out}.json/.md still name this machine ({', '.join(bad)})", file=sys.stderr)
    print(f"bench: wrote {args.out}.json, .png and .md")


if __name__ == "__main__":
    main()
