#!/usr/bin/env python3
"""The rl policy on the built-in traces: trained on some, evaluated on the others (held out),
against the heuristic and the ILP oracle, in the simulator.

    python scripts/bench_rl.py                       # default split, prints the table
    python scripts/bench_rl.py --train hotcold-phased,redis --test sqlite,zstd --json

Training is `pagetier train-rl builtin:... -o MODEL` (its wall time is printed); evaluation is
`pagetier bench sim builtin:... --policies heuristic,rl --rl-model MODEL` on both sets.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
TRAIN = "hotcold-phased,redis,churn"
TEST = "hotcold-stable,sqlite,zstd,pagerank"


def sim(names, model, caps, oracle_limit, no_oracle):
    cmd = [sys.executable, "-m", "pagetier.cli", "bench", "sim",
           *[f"builtin:{n}" for n in names], "--policies", "heuristic,rl", "--rl-model", model,
           "--capacity", caps, "--json", "--oracle-time-limit", str(oracle_limit)]
    if no_oracle:
        cmd.append("--no-oracle")
    r = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(r.stdout)["runs"]


def summarize(runs, label):
    out = []
    for trace in dict.fromkeys(r["trace"] for r in runs):
        for cap in dict.fromkeys(r["capacity"] for r in runs):
            by = {r["policy"]: r for r in runs if r["trace"] == trace and r["capacity"] == cap}
            out.append({"set": label, "trace": trace, "capacity": cap,
                        **{f"{p}_slowdown": by[p]["slowdown"] for p in by}})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--train", default=TRAIN)
    ap.add_argument("--test", default=TEST)
    ap.add_argument("--capacity", default="10%,25%,50%")
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--population", type=int, default=24)
    ap.add_argument("--oracle-time-limit", type=float, default=15)
    ap.add_argument("--no-oracle", action="store_true")
    ap.add_argument("--model", help="keep the model here (default: a temporary file)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    train, test = a.train.split(","), a.test.split(",")
    model = a.model or str(Path(tempfile.mkdtemp()) / "rl.npz")
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "pagetier.cli", "train-rl",
                        *[f"builtin:{n}" for n in train], "-o", model, "--budget", a.capacity,
                        "--epochs", str(a.epochs), "--population", str(a.population)],
                       capture_output=True, text=True, check=True)
    train_s = time.monotonic() - t0
    rows = (summarize(sim(train, model, a.capacity, a.oracle_time_limit, a.no_oracle), "train")
            + summarize(sim(test, model, a.capacity, a.oracle_time_limit, a.no_oracle), "held-out"))
    means = {}
    for s in ("train", "held-out"):
        sub = [x for x in rows if x["set"] == s]
        means[s] = {p: float(np.mean([x[f"{p}_slowdown"] for x in sub]))
                    for p in ("heuristic", "rl", "oracle") if f"{p}_slowdown" in sub[0]}
        means[s]["rl_beats_heuristic"] = sum(x["rl_slowdown"] < x["heuristic_slowdown"] - 1e-9
                                             for x in sub)
        means[s]["cases"] = len(sub)
    if a.json:
        print(json.dumps({"train": train, "test": test, "train_s": train_s, "trainer": r.stdout.strip(),
                          "rows": rows, "means": means}, indent=1))
        return 0
    print(r.stdout.strip())
    print(f"train-rl wall time {train_s:.0f} s on {', '.join(train)}")
    print(f"{'set':<9} {'trace':<15} {'cap':>4} {'heuristic':>9} {'rl':>7} {'oracle':>7}")
    for x in rows:
        o = x.get("oracle_slowdown")
        print(f"{x['set']:<9} {x['trace'][:15]:<15} {x['capacity']:>4} {x['heuristic_slowdown']:9.3f} "
              f"{x['rl_slowdown']:7.3f} {'-' if o is None else f'{o:7.3f}':>7}")
    for s, m in means.items():
        o = m.get("oracle")
        print(f"mean slowdown {s:<8}: heuristic {m['heuristic']:.3f}, rl {m['rl']:.3f}"
              + ("" if o is None else f", oracle {o:.3f}")
              + f"; rl better than heuristic in {m['rl_beats_heuristic']} of {m['cases']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
