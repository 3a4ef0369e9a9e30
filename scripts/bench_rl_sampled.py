#!/usr/bin/env python3
"""The rl policy on sampled traces: trained on built-in traces thinned as a PEBS-like sampler
would see them (``bench sim --sample``), evaluated on other built-in traces (held out), thinned
at the same rates, beside heuristic and lru, in the simulator.

    python scripts/bench_rl_sampled.py                     # default split and rates
    python scripts/bench_rl_sampled.py --rates 1/10000 --train redis,churn --test sqlite

Training is policies/rl.py's ``train`` on the thinned traces (each sample charged as the
1/RATE accesses it stands for); evaluation is bench sim's ``run_bench`` with ``samples``: the
policies see the samples and are charged every access.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from pagetier.bench import sim
from pagetier.policies import rl
from pagetier.policies.simulate import parse_sample_rate, thin

TRAIN = "hotcold-phased,redis,churn"
TEST = "hotcold-stable,sqlite,zstd,pagerank"
POLICIES = ("lru", "heuristic", "rl")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--train", default=TRAIN)
    ap.add_argument("--test", default=TEST)
    ap.add_argument("--rates", default="1/10000,1/100000")
    ap.add_argument("--capacity", default="10%,25%,50%")
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--population", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--model", help="keep the model here (default: a temporary file)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    rates = [(lb, parse_sample_rate(lb)) for lb in sim.split_list(a.rates)]
    caps = sim.split_list(a.capacity)
    cost = sim.cost_of_options("dram-cxl", None, None, None, None, "auto")
    train_sets, costs = [], []
    for name in sim.split_list(a.train):
        _, frames, interval_s = sim.load_trace(f"builtin:{name}")
        c = sim.for_trace(cost, frames, interval_s)
        for i, (_, r) in enumerate(rates):
            train_sets.append(thin(frames, r, a.seed + 101 * i, c.accesses_per_count))
            costs.append(dataclasses.replace(c, accesses_per_count=1.0 / r))
    t0 = time.monotonic()
    model, curve = rl.train(train_sets, capacities=[float(x.rstrip("%")) / 100 for x in caps],
                            cost=costs, epochs=a.epochs, population=a.population, seed=a.seed)
    train_s = time.monotonic() - t0
    path = a.model or str(Path(tempfile.mkdtemp()) / "rl.npz")
    model.save(path)
    out = {"train_s": train_s, "curve": curve, "rates": [lb for lb, _ in rates], "sets": {}}
    for label, names in (("train", a.train), ("held-out", a.test)):
        traces = [sim.load_trace(f"builtin:{n}") for n in sim.split_list(names)]
        rows, statics = sim.run_bench(traces, list(POLICIES), caps, cost, rl_model=path,
                                      oracle=False, samples=rates, seed=a.seed + 7)
        out["sets"][label] = {"rows": rows, "statics": statics}
    if a.json:
        print(json.dumps(out, indent=1, default=float))
        return 0
    print(f"rl trained in {train_s:.0f} s on {a.train} thinned at {a.rates} "
          f"(best training slowdown {curve[-1]:.3f})")
    for label, d in out["sets"].items():
        for lb, _ in rates:
            sub = [r for r in d["rows"] if r.get("sample") == lb]
            print(f"{label} @ {lb}: time / static")
            print(f"{'trace':<16} {'cap':>4} " + " ".join(f"{p:>9}" for p in POLICIES))
            by = {(r["trace"], r["capacity"], r["policy"]): r for r in sub}
            wins = {p: 0 for p in POLICIES if p != "rl"}
            for st in d["statics"]:
                k = (st["trace"], st["capacity"])
                v = {p: 1.0 + by[(*k, p)]["vs_static"] for p in POLICIES}
                for p in wins:
                    wins[p] += v["rl"] < v[p] - 1e-9
                print(f"{k[0][:16]:<16} {k[1]:>4} " + " ".join(f"{v[p]:9.3f}" for p in POLICIES))
            means = ", ".join(
                f"{p} {np.mean([1.0 + r['vs_static'] for r in sub if r['policy'] == p]):.3f}"
                for p in POLICIES)
            n = len(d["statics"])
            print(f"mean: {means}; rl faster than heuristic in {wins['heuristic']} of {n}, "
                  f"than lru in {wins['lru']} of {n}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
