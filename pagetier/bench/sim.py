"""What ``pagetier bench sim`` and ``pagetier train-rl`` run (their commands are in
pagetier/cli/): traces loaded, the cost model of the options, every policy replayed at every
capacity beside the oracle and static placement, the table, the losses and the plot.

A TRACE argument is a trace file written by ``pagetier record`` (profiler/trace.py), a
built-in trace ``builtin:NAME`` (policies/builtin_traces.py; ``pagetier bench traces`` lists
them) or a synthetic trace spec ``synth:PATTERN[:key=value,...]`` (policies/synth.py), for
example ``synth:zipf:pages=4096,seed=2``.
"""
from __future__ import annotations

import time
from pathlib import Path

from pagetier.errors import ConfigError

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


def split_list(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def cost_of_options(preset, fast_ns, slow_ns, migrate_us, migrate_mb_s, accesses_per_count,
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


# ----------------------------------------------------------------------------- bench sim
DEFAULT_POLICY = "heuristic"  # the daemon's default policy
BASELINES = ("lru", "heat-classes")  # what the default policy must not lose to (and static)
LOSS_TOLERANCE = 1e-4  # time ratios within 0.01% count as a tie (the estimate is not finer)


def run_bench(traces, policies, capacities, cost, *, rate=512.0, placement="slow",
              rl_model=None, oracle=True, oracle_time_limit=30.0, oracle_groups=256,
              oracle_windows=120, oracle_budget=None, progress=None, samples=None, seed=0,
              sample_of="accesses") -> tuple[list, list]:
    """Every (trace, capacity, policy) run: (runs, static runs), one dict per run.

    Each (trace, capacity) also gets the best static placement (policies/oracle.py), in the
    second list; every run says ``vs_static`` (its time over static's, minus 1). The oracle's
    run (``oracle``) is the better replay of the ILP's plan and of static placement
    (``oracle_source``), so its ``gap_to_static`` is <= 0; ``ilp_gap_to_static`` is the
    ILP's own. ``distance_to_oracle`` is relative to the oracle's time.

    ``oracle_budget``: seconds for all oracle solves together; each solve gets at most its
    share of what is left (and ``oracle_time_limit``), so the whole bench stays bounded.

    ``samples``: [(label, rate), ...] to replay each trace thinned at each rate
    (policies/simulate.py ``thin``, with ``seed``; ``sample_of`` "accesses": a count stands
    for the cost model's ``accesses_per_count`` accesses, "counts": the counts as recorded).
    The policies see the thinned counts and are charged the true ones; static placement and
    the oracle are planned on the true counts once per trace and capacity (the yardstick does
    not depend on the rate). Each policy row then says its ``sample`` label."""
    from pagetier.policies import oracle as oracle_mod
    from pagetier.policies.simulate import SimConfig, capacity_pages, footprint, simulate

    rows, statics = [], []
    base_cost = cost
    solves_left = len(traces) * len(capacities)
    budget_end = None if oracle_budget is None else time.monotonic() + oracle_budget
    from pagetier.policies.simulate import thin

    for ti, (name, frames, interval_s) in enumerate(traces):
        cost = for_trace(base_cost, frames, interval_s)
        fp = footprint(frames)
        units = oracle_mod.trace_units(frames)
        per_count = cost.accesses_per_count if sample_of == "accesses" else 1.0
        views = [(None, frames, None)] if not samples else [
            (label, thin(frames, r, seed + 7919 * ti, per_count), frames) for label, r in samples]
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
            for label, seen, truth in views:
                for pol in policies:
                    opts = {"model": str(rl_model)} if pol == "rl" else None
                    res = simulate(seen, pol, cfg, options=opts, name=pol, truth=truth)
                    row = {**base, **_row(res), "static_est_time_s": static_s,
                           "vs_static": vs(res.est_time_s)}
                    if label is not None:
                        row["sample"] = label
                    if ref:
                        row["distance_to_oracle"] = res.est_time_s / ref - 1.0
                    rows.append(row)
                    if progress:
                        progress()
    return rows, statics


def sample_rows(rows: list[dict], label) -> list[dict]:
    """The oracle's rows and the policies' rows of sampling rate ``label``."""
    return [r for r in rows if r["policy"] == "oracle" or r.get("sample") == label]


SAMPLE_GOAL = 1.03  # the sampled-trace goal: heuristic at most this times the oracle


def sample_summary(rows: list[dict], statics: list[dict], label: str,
                   policy: str = DEFAULT_POLICY) -> str:
    """One line for sampling rate ``label``: the mean time over static placement of
    ``policy``, lru and the oracle, ``policy``'s worst ratio to lru and to the oracle, and in
    how many (trace, capacity) pairs it is no slower than lru and within ``SAMPLE_GOAL`` of
    the oracle."""
    sub = sample_rows(rows, label)
    by = {(r["trace"], r["capacity"], r["policy"]): r for r in sub}

    def mean(p):
        xs = [1.0 + r["vs_static"] for r in sub if r["policy"] == p]
        return f"{p} {sum(xs) / len(xs):.3f}" if xs else None

    parts = [m for m in (mean(policy), mean("lru"), mean("oracle")) if m]
    vs_lru, vs_opt, met = [], [], 0
    for st in statics:
        k = (st["trace"], st["capacity"])
        mine, lru, opt = by.get((*k, policy)), by.get((*k, "lru")), by.get((*k, "oracle"))
        if mine is None:
            continue
        a = lru and mine["est_time_s"] / lru["est_time_s"]
        b = opt and mine["est_time_s"] / opt["est_time_s"]
        if a:
            vs_lru.append(a)
        if b:
            vs_opt.append(b)
        met += bool((a is None or a <= 1.0 + LOSS_TOLERANCE) and (b is None or b <= SAMPLE_GOAL))
    out = f"sample {label}: time / static: {', '.join(parts)}"
    if vs_lru:
        out += f"; {policy}/lru mean {sum(vs_lru) / len(vs_lru):.3f} worst {max(vs_lru):.3f}"
    if vs_opt:
        out += f"; {policy}/oracle mean {sum(vs_opt) / len(vs_opt):.3f} worst {max(vs_opt):.3f}"
    if vs_lru or vs_opt:
        goal = "no slower than lru" + (f", within {SAMPLE_GOAL:g}x the oracle" if vs_opt else "")
        out += f"; {goal} in {met} of {len(statics)}"
    return out


def format_sample_table(rows: list[dict], statics: list[dict], label: str) -> str:
    """For sampling rate ``label``: each (trace, capacity)'s time over static placement, one
    column per policy and the oracle (planned on the true counts)."""
    sub = sample_rows(rows, label)
    pols = list(dict.fromkeys(r["policy"] for r in sub if r["policy"] != "oracle"))
    if any(r["policy"] == "oracle" for r in sub):
        pols.append("oracle")
    by = {(r["trace"], r["capacity"], r["policy"]): r for r in sub}
    w = max([12] + [len(p) for p in pols])
    out = [f"sampled at {label}: time / best static placement",
           f"{'trace':<16} {'cap':>4} " + " ".join(f"{p:>{w}}" for p in pols)]
    for st in statics:
        cells = []
        for p in pols:
            r = by.get((st["trace"], st["capacity"], p))
            cells.append(f"{'-' if r is None else format(1.0 + r['vs_static'], '.3f'):>{w}}")
        out.append(f"{st['trace'][:16]:<16} {str(st['capacity']):>4} " + " ".join(cells))
    return "\n".join(out)


def _row(res) -> dict:
    d = res.as_dict()
    keep = ("policy", "est_time_s", "slowdown", "hit_ratio", "migrated_pages", "migrated_bytes",
            "promoted_pages", "demoted_pages", "ping_pongs", "clipped", "access_s", "migrate_s",
            "all_fast_s", "intervals", "phase_starts", "phase_t95", "min_moved_pages",
            "moved_ratio")
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


CLIP_RATIO = 3.0  # a policy this many times further from static than the next is drawn clipped


def _plot_limit(rows: list[dict]) -> float:
    """The x range (|time vs static|, as a fraction) that shows the policies' differences:
    the largest distance, unless one policy (first-touch, typically) is more than
    CLIP_RATIO times further than every other; then its bars are clipped."""
    far = {}
    for r in rows:
        far[r["policy"]] = max(far.get(r["policy"], 0.0), abs(r["vs_static"]))
    top = sorted(far.values(), reverse=True) + [0.0, 0.0]
    limit = top[1] * 1.35 if top[0] > CLIP_RATIO * top[1] > 0 else top[0] * 1.2
    return max(limit, 0.01)


def _percent(v: float) -> str:
    """A bar's label: 0.1% steps, 0.01% below 0.05%, and "<0.01%" for a nonzero difference
    smaller than that (a tie is "0.0%")."""
    if v == 0:
        return "0.0%"
    if abs(v) < 0.005:
        return f"{'+' if v > 0 else '-'}<0.01%"
    return f"{v:+.1f}%" if abs(v) >= 0.05 else f"{v:+.2f}%"


def figure(rows: list[dict]):
    """Each run's estimated time against the best static placement of its trace and capacity,
    one panel per trace: a bar per policy and capacity from 0 (static) with its value written
    at its end, so that policies which tie stay visible and the axis shows differences of a
    fraction of a percent. A policy far off the others (first-touch) is clipped at the edge,
    its value still written, marked with an arrow."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    runs = [r for r in rows if r["policy"] != "static"]
    traces = list(dict.fromkeys(r["trace"] for r in runs))
    policies = list(dict.fromkeys(r["policy"] for r in runs))
    caps = list(dict.fromkeys(r["capacity"] for r in runs))
    colours = plt.get_cmap("viridis")(np.linspace(0.15, 0.8, max(len(caps), 1)))
    ncols = min(4, len(traces))
    nrows = -(-len(traces) // ncols)
    height = 0.9 + 0.2 * len(policies) * len(caps)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.6 * ncols, height * nrows), squeeze=False)
    for ax in axes.flat[len(traces):]:
        ax.set_visible(False)
    step = len(caps) + 1  # one row per capacity, and a blank row between policies
    for ax, tr in zip(axes.flat, traces):
        sub = [r for r in runs if r["trace"] == tr]
        limit = _plot_limit(sub) * 100
        pad = 0.02 * limit
        for r in sub:
            v = r["vs_static"] * 100
            j = caps.index(r["capacity"])
            y = policies.index(r["policy"]) * step + j
            shown = max(-limit, min(limit, v))
            ax.barh(y, shown, color=colours[j], height=0.8)
            text = _percent(v)
            if shown != v:  # clipped: the value inside the bar, an arrow past its end
                ax.annotate("", (shown + 6 * pad, y), (shown, y),
                            arrowprops={"arrowstyle": "->", "lw": 0.8})
                ax.text(shown - pad, y, text, va="center", ha="right", fontsize=6.5,
                        color="white")
            else:
                ax.text(shown + (pad if v >= 0 else -pad), y, text, va="center",
                        ha="left" if v >= 0 else "right", fontsize=6.5)
        ax.set_yticks([i * step + (len(caps) - 1) / 2 for i in range(len(policies))], policies,
                      fontsize=8)
        ax.set_ylim(len(policies) * step - 1, -1)
        ax.axvline(0, color="k", lw=0.8)
        lo = max(-limit, min([0.0] + [r["vs_static"] * 100 for r in sub]))
        hi = min(limit, max([0.0] + [r["vs_static"] * 100 for r in sub]))
        room = 0.22 * (hi - lo or 1.0)  # for the value labels past the bars' ends
        ax.set_xlim(lo - (room if lo < 0 else pad), hi + room)
        ax.set_title(tr if len(tr) <= 44 else tr[:43] + "…", fontsize=9)
        ax.set_xlabel("est. time vs best static placement (%)", fontsize=8)
        ax.tick_params(axis="x", labelsize=7)
        ax.grid(axis="x", alpha=0.3)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in colours[:len(caps)]]
    fig.legend(handles, [f"fast capacity {c}" for c in caps], fontsize=7, loc="lower center",
               ncol=len(caps), frameon=False)
    fig.tight_layout(rect=(0, 0.3 / (height * nrows), 1, 1))  # room for the legend below
    return fig


def plot(rows: list[dict], path) -> None:
    """:func:`figure` of ``rows``, written to ``path`` (its suffix says the format)."""
    import matplotlib.pyplot as plt

    fig = figure(rows)
    fig.savefig(path, dpi=110)
    plt.close(fig)
