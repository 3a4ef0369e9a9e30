"""``pagetier bench sim`` and ``pagetier train-rl``: policies compared on traces, and the rl
trainer.

A TRACE argument is a trace file written by ``pagetier record`` (profiler/trace.py), a
built-in trace ``builtin:NAME`` (policies/builtin_traces.py; ``pagetier bench traces`` lists
them) or a synthetic trace spec ``synth:PATTERN[:key=value,...]`` (policies/synth.py), for
example ``synth:zipf:pages=4096,seed=2``.
"""
from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path

import click

from pagetier.errors import ConfigError
from pagetier.policies.simulate import PRESETS

DEFAULT_POLICIES = "first-touch,lru,heat-classes,heuristic"


def load_trace(spec: str) -> tuple[str, list, float | None]:
    """(name, frames, interval_s or None) for a trace file, a ``builtin:`` or a ``synth:`` spec."""
    if spec.startswith("synth:"):
        from pagetier.policies import synth

        return spec[len("synth:"):], synth.from_spec(spec), None
    from pagetier.profiler.trace import read_trace

    if spec.startswith("builtin:"):
        from pagetier.policies import builtin_traces

        tr = read_trace(builtin_traces.path(spec[len("builtin:"):]))
        return spec[len("builtin:"):], list(tr.intervals()), (tr.interval_s or None)

    tr = read_trace(spec)
    return Path(spec).stem, list(tr.intervals()), (tr.interval_s or None)


def _split(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def _cost(preset, fast_ns, slow_ns, migrate_us, migrate_mb_s, accesses_per_count,
          cost_file=None):
    """The CostModel of the options; ``accesses_per_count`` "auto" leaves it to ``for_trace``."""
    from pagetier.policies.simulate import cost_model

    if accesses_per_count == "auto":
        accesses_per_count = None
    else:
        try:
            accesses_per_count = float(accesses_per_count)
        except ValueError:
            raise ConfigError(f"--accesses-per-count {accesses_per_count!r}: give a number "
                              "or auto") from None
    cost = cost_model(preset, fast_ns=fast_ns, slow_ns=slow_ns, migrate_us=migrate_us,
                      migrate_mb_s=migrate_mb_s, accesses_per_count=accesses_per_count,
                      base_file=cost_file)
    cost.auto_anchor = accesses_per_count is None and cost.name != "measured"
    return cost


def for_trace(cost, frames, interval_s):
    """The cost model for one trace: time-anchored when the counts are recorded (not synth:)
    and --accesses-per-count is auto (see policies/simulate.py)."""
    from pagetier.policies.simulate import time_anchored

    if getattr(cost, "auto_anchor", False) and interval_s is not None:
        return time_anchored(cost, frames, interval_s)
    return cost


def cost_options(f):
    opts = [
        click.option("--preset", type=click.Choice(sorted(PRESETS)), default="dram-cxl",
                     show_default=True, help="Cost model of the fast/slow pair."),
        click.option("--cost-file", type=click.Path(dir_okay=False),
                     help="Cost model derived by `pagetier bench costmodel` (JSON), instead "
                          "of --preset; the options below still override it."),
        click.option("--fast-ns", type=float, help="Per-access time on the fast node (ns)."),
        click.option("--slow-ns", type=float, help="Per-access time on the slow node (ns)."),
        click.option("--migrate-us", type=float, help="Fixed cost per page migrated (us)."),
        click.option("--migrate-mb-s", type=float, help="Migration copy bandwidth (MB/s)."),
        click.option("--accesses-per-count", default="auto", show_default=True,
                     help="Real accesses one recorded count stands for; auto: 1 for synth: "
                          "traces, and for recorded ones what makes the all-fast time the "
                          "recorded duration."),
        click.option("--rate", type=float, default=512.0, show_default=True,
                     help="Migration rate limit in MB/s, as the daemon's --rate (0: none)."),
        click.option("--placement", type=click.Choice(["slow", "fast-first"]), default="slow",
                     show_default=True, help="Where a page goes at first touch."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


# ----------------------------------------------------------------------------- bench sim
DEFAULT_POLICY = "heuristic"  # the daemon's default policy
BASELINES = ("lru", "heat-classes")  # what the default policy must not lose to (and static)
LOSS_TOLERANCE = 1e-4  # time ratios within 0.01% count as a tie (the estimate is not finer)


def run_bench(traces, policies, capacities, cost, *, rate=512.0, placement="slow",
              rl_model=None, oracle=True, oracle_time_limit=30.0, oracle_groups=256,
              oracle_windows=120, oracle_budget=None, progress=None) -> tuple[list, list]:
    """Every (trace, capacity, policy) run: (runs, static runs), one dict per run.

    Each (trace, capacity) also gets the best static placement (policies/oracle.py), in the
    second list; every run says ``vs_static`` (its time over static's, minus 1). The oracle's
    run (``oracle``) is the better replay of the ILP's plan and of static placement
    (``oracle_source``), so its ``gap_to_static`` is <= 0; ``ilp_gap_to_static`` is the
    ILP's own. ``distance_to_oracle`` is relative to the oracle's time.

    ``oracle_budget``: seconds for all oracle solves together; each solve gets at most its
    share of what is left (and ``oracle_time_limit``), so the whole bench stays bounded."""
    from pagetier.policies import oracle as oracle_mod
    from pagetier.policies.simulate import SimConfig, capacity_pages, footprint, simulate

    rows, statics = [], []
    base_cost = cost
    solves_left = len(traces) * len(capacities)
    budget_end = None if oracle_budget is None else time.monotonic() + oracle_budget
    for name, frames, interval_s in traces:
        cost = for_trace(base_cost, frames, interval_s)
        fp = footprint(frames)
        units = oracle_mod.trace_units(frames)
        for cap_spec in capacities:
            cap = capacity_pages(cap_spec, fp)
            cfg = SimConfig(capacity=cap, cost=cost, rate_mb_s=rate, interval_s=interval_s,
                            placement=placement)
            base = {"trace": name, "capacity": cap_spec, "capacity_pages": cap,
                    "footprint_pages": fp, "accesses_per_count": cost.accesses_per_count}
            ref = None
            limit = oracle_time_limit
            if oracle and budget_end is not None:
                limit = max(1.0, min(limit, (budget_end - time.monotonic()) / solves_left))
            solves_left -= 1
            y = oracle_mod.yardstick(frames, cfg, ilp=oracle, units=units,
                                     max_groups=oracle_groups, max_windows=oracle_windows,
                                     time_limit=limit)
            static_s = y.static.est_time_s
            vs = (lambda t: t / static_s - 1.0) if static_s else (lambda t: 0.0)  # noqa: E731
            statics.append({**base, **_row(y.static), "vs_static": 0.0,
                            "static": y.static_plan.describe()})
            if progress:
                progress()
            if oracle:
                ref = y.best.est_time_s
                rows.append({**base, **_row(y.best), "policy": "oracle",
                             "optimal": y.solution.optimal, "oracle": y.solution.describe(),
                             "oracle_source": y.source, "ilp_est_time_s": y.ilp.est_time_s,
                             "ilp_slowdown": y.ilp.slowdown, "static_est_time_s": static_s,
                             "gap_to_static": y.gap_to_static,
                             "ilp_gap_to_static": y.ilp_gap_to_static,
                             "vs_static": y.gap_to_static, "distance_to_oracle": 0.0})
                if progress:
                    progress()
            for pol in policies:
                opts = {"model": str(rl_model)} if pol == "rl" else None
                res = simulate(frames, pol, cfg, options=opts, name=pol)
                row = {**base, **_row(res), "static_est_time_s": static_s,
                       "vs_static": vs(res.est_time_s)}
                if ref:
                    row["distance_to_oracle"] = res.est_time_s / ref - 1.0
                rows.append(row)
                if progress:
                    progress()
    return rows, statics


def _row(res) -> dict:
    d = res.as_dict()
    keep = ("policy", "est_time_s", "slowdown", "hit_ratio", "migrated_pages", "migrated_bytes",
            "promoted_pages", "demoted_pages", "ping_pongs", "clipped", "access_s", "migrate_s",
            "all_fast_s", "intervals")
    return {k: d[k] for k in keep}


def losses(rows: list[dict], statics: list[dict], policy: str = DEFAULT_POLICY,
           baselines=BASELINES) -> list[dict]:
    """Where ``policy`` is slower than a baseline or than static placement: one dict per
    (trace, capacity, baseline), with ``ratio`` = its time over the baseline's (above
    1 + ``LOSS_TOLERANCE``)."""
    out = []
    by = {(r["trace"], r["capacity"], r["policy"]): r for r in rows + statics}
    for st in statics:
        mine = by.get((st["trace"], st["capacity"], policy))
        if mine is None:
            continue
        for b in (*baselines, "static"):
            other = by.get((st["trace"], st["capacity"], b))
            if other is None or not other["est_time_s"] > 0:
                continue
            ratio = mine["est_time_s"] / other["est_time_s"]
            if ratio > 1.0 + LOSS_TOLERANCE:
                out.append({"trace": st["trace"], "capacity": st["capacity"], "policy": policy,
                            "baseline": b, "ratio": ratio, "slowdown": mine["slowdown"],
                            "baseline_slowdown": other["slowdown"]})
    return out


def format_losses(found: list[dict], statics: list[dict], rows: list[dict],
                  policy: str = DEFAULT_POLICY, baselines=BASELINES) -> str:
    """Lines saying where ``policy`` loses, and how many such cases there are of each kind."""
    present = [b for b in (*baselines, "static") if b == "static" or any(r["policy"] == b for r in rows)]
    if not any(r["policy"] == policy for r in rows) or not statics:
        return ""
    cases = len(statics)
    if not found:
        return (f"{policy} is at least as good as {', '.join(present)} in every trace and "
                f"capacity pair ({cases})")
    out = []
    groups: dict = {}
    for x in found:
        groups.setdefault((x["trace"], x["capacity"]), []).append(x)
    for (trace, cap), xs in groups.items():
        what = ", ".join(f"{x['baseline']} by {x['ratio']:.4f}x ({x['slowdown']:.3f} vs "
                         f"{x['baseline_slowdown']:.3f})" for x in xs)
        out.append(f"{policy} LOSES on {trace} {cap}: slower than {what}")
    counts = ", ".join(f"{b} in {sum(x['baseline'] == b for x in found)}" for b in present)
    out.append(f"{policy} is slower than {counts} of {cases} trace and capacity pairs")
    return "\n".join(out)


def format_table(rows: list[dict], statics: list[dict] | None = None) -> str:
    """The runs, with each (trace, capacity)'s static run after its oracle run."""
    head = f"{'trace':<14} {'cap':>4} {'policy':<12} {'est s':>8} {'slow':>6} {'hit':>6} " \
           f"{'MB mv':>7} {'pp':>5} {'vs opt':>7} {'vs st':>7}"
    out = [head]
    statics = statics or []
    st_by = {(s["trace"], s["capacity"]): s for s in statics}
    ordered, done = [], set()
    for r in rows:
        key = (r["trace"], r["capacity"])
        if key not in done and r["policy"] != "oracle" and key in st_by:
            ordered.append(st_by[key])  # no oracle run: static comes first
        ordered.append(r)
        if r["policy"] == "oracle" and key in st_by:
            ordered.append(st_by[key])
        done.add(key)
    for r in ordered:
        dist = r.get("distance_to_oracle")
        vs = r.get("vs_static")
        mark = "" if r.get("optimal", True) else "*"
        if r["policy"] == "oracle" and r.get("oracle_source") == "static":
            mark += "="
        ds = "-" if dist is None else f"{dist:+.1%}"
        vss = "-" if vs is None else f"{vs:+.1%}"
        out.append(f"{r['trace'][:14]:<14} {str(r['capacity']):>4} {(r['policy'] + mark)[:12]:<12} "
                   f"{r['est_time_s']:8.3g} {r['slowdown']:6.3f} {r['hit_ratio']:6.1%} "
                   f"{r['migrated_bytes'] / (1 << 20):7.1f} {r['ping_pongs']:5d} {ds:>7} {vss:>7}")
    out.append("static: the best fixed set of units for the whole trace; vs st: time over "
               "static's")
    if any(not r.get("optimal", True) for r in rows):
        out.append("oracle*: bounded (time limit or gap), not proven optimal")
    if any(r.get("oracle_source") == "static" for r in rows):
        out.append("oracle=: the ILP's plan was not better than static placement; the oracle "
                   "is static's")
    for r in rows:
        if r.get("oracle"):
            gap = r.get("ilp_gap_to_static")
            out.append(f"{r['trace'][:16]} {r['capacity']}: {r['oracle']}"
                       + ("" if gap is None else f"; ILP {gap:+.2%} vs static"))
    return "\n".join(out)


def plot(rows: list[dict], path) -> None:
    """Estimated slowdown against fast-tier capacity, one line per policy, one panel per trace."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    traces = list(dict.fromkeys(r["trace"] for r in rows))
    ncols = min(4, len(traces))
    nrows = -(-len(traces) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.2 * ncols, 3.4 * nrows), squeeze=False)
    for ax in axes.flat[len(traces):]:
        ax.set_visible(False)
    for ax, tr in zip(axes.flat, traces):
        sub = [r for r in rows if r["trace"] == tr]
        for pol in dict.fromkeys(r["policy"] for r in sub):
            pts = sorted((r["capacity_pages"] / max(r["footprint_pages"], 1) * 100, r["slowdown"])
                         for r in sub if r["policy"] == pol)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=pol,
                    linestyle={"oracle": "--", "static": ":"}.get(pol, "-"))
        ax.set_title(tr, fontsize=9)
        ax.set_xlabel("fast-tier capacity (% of footprint)")
        ax.set_ylabel("estimated slowdown vs all-fast")
        ax.grid(alpha=0.3)
    axes.flat[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


@click.group("bench")
def bench():
    """Compare placement policies: `sim` replays traces in the simulator, `live` runs them in
    the test VM against the kernel's own tiering, `traces` lists the built-in trace set,
    `costmodel` measures a cost model from two runs of a program."""


@bench.command("sim")
@click.argument("traces", nargs=-1)
@click.option("--policies", default=DEFAULT_POLICIES, show_default=True,
              help="Comma-separated policy names (rl needs --rl-model).")
@click.option("--capacity", "capacities", default="10%,25%,50%", show_default=True,
              help="Fast-tier capacities: % of each trace's footprint, or sizes (64M).")
@cost_options
@click.option("--rl-model", type=click.Path(dir_okay=False), help="Model for the rl policy.")
@click.option("--no-oracle", is_flag=True, help="Skip the ILP oracle (no distance to it).")
@click.option("--oracle-time-limit", type=float, default=30.0, show_default=True,
              help="Seconds per oracle solve; past it the answer is marked bounded.")
@click.option("--oracle-budget", type=float, default=300.0, show_default=True,
              help="Seconds for all oracle solves together (each gets its share of what is "
                   "left, at most --oracle-time-limit).")
@click.option("--oracle-groups", type=int, default=256, show_default=True,
              help="At most this many groups of units (clustered by heat over time) in the "
                   "oracle's ILP.")
@click.option("--oracle-windows", type=int, default=120, show_default=True,
              help="At most this many time windows in the oracle's ILP.")
@click.option("--json", "as_json", is_flag=True, help="Print the runs as JSON.")
@click.option("-o", "--plot", "plot_path", type=click.Path(dir_okay=False),
              help="Write a plot of slowdown vs capacity (PNG).")
def bench_sim(traces, policies, capacities, preset, cost_file, fast_ns, slow_ns, migrate_us,
              migrate_mb_s, accesses_per_count, rate, placement, rl_model, no_oracle,
              oracle_time_limit, oracle_budget, oracle_groups, oracle_windows, as_json, plot_path):
    """Replay TRACES through each policy at each capacity and estimate the run time.

    \b
    For each trace, capacity and policy: estimated time, slowdown against all-fast,
    fast-tier hit ratio, MB migrated, ping-pongs, distance to the oracle and to the best
    static placement (the best fixed set of units, computed exactly on the trace). The
    oracle is the better of an ILP's plan (HiGHS, seeded with the static set) and static
    placement, so it is never worse than static. Then a line for each trace and capacity
    where heuristic is slower than lru, heat-classes or static, with the ratio.
    Without TRACES: the built-in trace set (`pagetier bench traces` lists it).
    \b
    Examples:
      pagetier bench sim -o slowdown.png
      pagetier bench sim builtin:redis builtin:sqlite --preset dram-pmem
      pagetier bench sim synth:hotcold synth:zipf:seed=2 --capacity 10%,25%,50%
      pagetier bench sim run.trace --preset dram-pmem --policies heuristic,lru -o plot.png
      pagetier bench sim synth:phased --policies heuristic,rl --rl-model rl.npz --json
    """
    pols = _split(policies)
    if "rl" in pols and not rl_model:
        raise click.UsageError("policy rl needs --rl-model PATH")
    from pagetier.policies.base import known

    if "rl" in pols:
        import pagetier.policies.rl  # noqa: F401  registers "rl"
    for p in pols:
        if p not in known():
            raise click.UsageError(f"unknown policy {p!r} (known: {', '.join(known())})")
    cost = _cost(preset, fast_ns, slow_ns, migrate_us, migrate_mb_s, accesses_per_count, cost_file)
    caps = _split(capacities)
    if not traces:
        from pagetier.policies import builtin_traces

        traces = [f"builtin:{n}" for n in builtin_traces.names()]
    loaded = [load_trace(t) for t in traces]
    n = len(loaded) * len(caps) * (len(pols) + (1 if no_oracle else 2))
    t0 = time.monotonic()
    with click.progressbar(length=n, label="simulating", file=sys.stderr) as bar:
        rows, statics = run_bench(loaded, pols, caps, cost, rate=rate, placement=placement,
                         rl_model=rl_model, oracle=not no_oracle,
                         oracle_time_limit=oracle_time_limit, oracle_budget=oracle_budget,
                         oracle_groups=oracle_groups,
                         oracle_windows=oracle_windows, progress=lambda: bar.update(1))
    found = losses(rows, statics)
    if as_json:
        click.echo(json.dumps({"preset": cost.name, "cost": dataclasses.asdict(cost), "runs": rows,
                               "static": statics, "losses": found}, indent=1))
    else:
        click.echo(f"cost model {cost.name}: fast {cost.fast_ns:g} ns, slow {cost.slow_ns:g} ns, "
                   f"{cost.page_move_s * 1e6:.2f} us per page moved; rate {rate:g} MB/s")
        if getattr(cost, "auto_anchor", False) and any(r["accesses_per_count"] != cost.accesses_per_count
                                                       for r in rows):
            click.echo("recorded traces: counts scaled so that all-fast time = recorded duration "
                       "(--accesses-per-count auto)")
        click.echo(format_table(rows, statics))
        note = format_losses(found, statics, rows)
        if note:
            click.echo(note)
    if plot_path:
        plot(rows + statics, plot_path)
        click.echo(f"plot written to {plot_path}", err=True)
    click.echo(f"{n} runs in {time.monotonic() - t0:.0f} s", err=True)


@bench.command("traces")
@click.option("--json", "as_json", is_flag=True, help="Print the index as JSON.")
def bench_traces(as_json):
    """List the built-in trace set (real programs recorded in the test VM).

    \b
    Examples:
      pagetier bench traces
      pagetier bench sim builtin:redis builtin:torch-mlp
    """
    from pagetier.policies import builtin_traces

    if as_json:
        click.echo(json.dumps(builtin_traces.index(), indent=1))
    else:
        click.echo(builtin_traces.table())


@bench.command("costmodel", context_settings={"ignore_unknown_options": True})
@click.option("--trace", "trace_path", required=True, type=click.Path(dir_okay=False),
              help="A trace of the same program (`pagetier record`): its counts per second.")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False),
              help="Where to write the cost model (JSON, for --cost-file).")
@click.option("--fast-node", type=int, default=0, show_default=True)
@click.option("--slow-node", type=int, default=1, show_default=True)
@click.option("--cpu-node", type=int, default=0, show_default=True,
              help="Node whose CPUs run the program in both runs (-1: no CPU binding).")
@click.option("--repeat", type=int, default=3, show_default=True,
              help="Runs on each node (alternating); the fastest of each counts.")
@click.option("--preset", type=click.Choice(sorted(PRESETS)), default="dram-cxl", show_default=True,
              help="Where the migration cost comes from (two runs do not measure it).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.argument("cmd", nargs=-1, required=True, type=click.UNPROCESSED)
def bench_costmodel(trace_path, output, fast_node, slow_node, cpu_node, repeat, preset, as_json,
                    cmd):
    """Derive a cost model from two runs of CMD: all memory on the fast node, then on the slow.

    \b
    The per-count time on the fast node is the trace's duration over its counts; the slow
    node's is that times the ratio of the two run times (differential tracing). CMD must do
    a fixed amount of work (not run for a fixed time).
    \b
    Examples:
      pagetier record -b kmod -O mode=abit --interval 300 -p $(pgrep myjob) -o job.parquet
      pagetier bench costmodel --trace job.parquet -o cost.json -- ./myjob --small-input
      pagetier bench sim job.parquet --cost-file cost.json
    """
    from pagetier.policies import costmodel
    from pagetier.profiler.trace import read_trace

    tr = read_trace(trace_path)
    counts, seconds = costmodel.trace_rate(tr)
    with click.progressbar(length=2 * repeat, label="timing runs", file=sys.stderr) as bar:
        m = costmodel.measure(list(cmd), fast_node, slow_node,
                              None if cpu_node < 0 else cpu_node, repeat,
                              progress=lambda: bar.update(1))
    cost, clamped = costmodel.derive(m, counts, seconds, PRESETS[preset])
    extra = {"trace": str(trace_path), "trace_counts": counts, "trace_seconds": seconds,
             "ratio": min(m["runs_slow_s"]) / min(m["runs_fast_s"]), "clamped": clamped,
             "migration_from": preset}
    costmodel.save(output, cost, m, extra)
    if as_json:
        click.echo(json.dumps({"cost": dataclasses.asdict(cost), "measured": {**m, **extra}}, indent=1))
        return
    click.echo(f"all on node {fast_node}: {min(m['runs_fast_s']):.3f} s, all on node {slow_node}: "
               f"{min(m['runs_slow_s']):.3f} s (best of {repeat}); slow/fast {extra['ratio']:.3f}"
               + (" (not slower: slow time clamped to fast)" if clamped else ""))
    click.echo(f"per count: fast {cost.fast_ns:.4g} ns, slow {cost.slow_ns:.4g} ns "
               f"({counts} counts over {seconds:.1f} s of trace); migration from {preset}; "
               f"wrote {output}")


# ----------------------------------------------------------------------------- train-rl
@click.command("train-rl")
@click.argument("traces", nargs=-1, required=True)
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False),
              help="Where to write the model (.npz).")
@click.option("--budget", default="10%,25%,50%", show_default=True,
              help="Fast-tier capacities to train for, as % of each trace's footprint.")
@click.option("--epochs", type=int, default=20, show_default=True)
@click.option("--population", type=int, default=24, show_default=True,
              help="Candidates per cross-entropy-method epoch.")
@click.option("--chunks", type=int, default=32, show_default=True, help="Address chunks.")
@click.option("--history", type=int, default=4, show_default=True,
              help="Intervals of heat in the observation.")
@click.option("--seed", type=int, default=0, show_default=True)
@cost_options
def train_rl(traces, output, budget, epochs, population, chunks, history, seed, preset, cost_file,
             fast_ns, slow_ns, migrate_us, migrate_mb_s, accesses_per_count, rate, placement):
    """Train the rl policy's model on TRACES and write it to MODEL.

    \b
    Examples:
      pagetier train-rl synth:hotcold synth:phased synth:scan -o rl.npz
      pagetier train-rl a.trace b.trace -o rl.npz --budget 25% --epochs 40
      pagetier run --policy rl --policy-option model=rl.npz -- ./job
    """
    from pagetier.policies import rl

    cost = _cost(preset, fast_ns, slow_ns, migrate_us, migrate_mb_s, accesses_per_count, cost_file)
    caps = []
    for c in _split(budget):
        if not c.endswith("%"):
            raise click.BadParameter(f"{c!r}: give capacities as % of the footprint", param_hint="--budget")
        caps.append(float(c[:-1]) / 100.0)
    loaded, costs = [], []
    for t in traces:
        _, frames, interval_s = load_trace(t)
        loaded.append(frames)
        costs.append(for_trace(cost, frames, interval_s))
    t0 = time.monotonic()
    with click.progressbar(length=epochs, label="training", file=sys.stderr) as bar:
        model, curve = rl.train(loaded, capacities=caps, cost=costs, epochs=epochs,
                                population=population, n_chunks=chunks, history=history,
                                rate_mb_s=rate, placement=placement, seed=seed,
                                progress=lambda e, f: bar.update(1))
    model.save(output)
    click.echo(f"trained on {len(loaded)} trace(s) x {len(caps)} capacities in "
               f"{time.monotonic() - t0:.0f} s: mean slowdown {curve[0]:.3f} -> {curve[-1]:.3f} "
               f"(chunk-level model); wrote {output}")


def _add_live() -> None:
    from pagetier import live_bench

    bench.add_command(live_bench.command, "live")


_add_live()
commands = {"bench": bench, "train-rl": train_rl}


if __name__ == "__main__":  # pragma: no cover
    try:
        bench()
    except ConfigError as e:
        click.echo(f"pagetier: {e}", err=True)
        sys.exit(1)
