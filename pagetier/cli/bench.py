"""``pagetier bench``: compare placement policies. ``sim`` replays traces in the simulator,
``traces`` lists the built-in set, ``costmodel`` measures a cost model, ``live`` runs the policies
in the test VM against the kernel's own tiering. The work is done in pagetier/bench/."""
from __future__ import annotations

import dataclasses
import json
import shlex
import sys
import time
from pathlib import Path

import click

from pagetier.bench import live, sim
from pagetier.checkout import in_guest as in_guest_env
from pagetier.cli import check_output, resolve_trace
from pagetier.errors import ConfigError
from pagetier.policies.simulate import PRESETS


PLOT_SUFFIXES = (".png", ".svg", ".pdf")  # what matplotlib writes from the name alone


def capacity_list(text: str, option: str = "--capacity", sizes: bool = True) -> list[str]:
    """The capacities of ``text`` ("10%,25%" or, with ``sizes``, "64M"), checked before any
    trace is loaded: a share of the footprint is 0-100%."""
    from pagetier.core.units import parse_size

    right = "a % of each trace's footprint (e.g. 25%)" + (" or a size (e.g. 64M)" if sizes else "")
    caps = sim.split_list(text)
    if not caps:
        raise ConfigError(f"{option} {text!r}: give {right}")
    for c in caps:
        if c.endswith("%"):
            try:
                share = float(c[:-1])
            except ValueError:
                raise ConfigError(f"{option} {c!r}: give {right}") from None
            if not 0 <= share <= 100:
                raise ConfigError(f"{option} {c!r}: a share of the footprint is 0-100%")
        elif not sizes:
            raise ConfigError(f"{option} {c!r}: give {right}")
        else:
            try:
                parse_size(c)
            except ConfigError:
                raise ConfigError(f"{option} {c!r}: give {right}") from None
    return caps


def cost_options(f):
    """The cost-model options bench sim and train-rl share (see bench/sim.py's cost_of_options)."""
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
        click.option("--rate", type=click.FloatRange(0, None), default=512.0, show_default=True,
                     help="Migration rate limit in MB/s, as the daemon's --rate (0: none)."),
        click.option("--placement", type=click.Choice(["slow", "fast-first"]), default="slow",
                     show_default=True, help="Where a page goes at first touch."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


@click.group("bench")
def command():
    """Compare placement policies: `sim` replays traces in the simulator, `live` runs them in
    the test VM against the kernel's own tiering, `traces` lists the built-in trace set,
    `costmodel` measures a cost model from two runs of a program."""


@command.command("sim")
@click.argument("traces", nargs=-1)
@click.option("--policies", default=sim.DEFAULT_POLICIES, show_default=True,
              help="Comma-separated policy names (rl needs --rl-model).")
@click.option("--capacity", "capacities", default="10%,25%,50%", show_default=True,
              help="Fast-tier capacities: % of each trace's footprint, or sizes (64M).")
@cost_options
@click.option("--rl-model", type=click.Path(dir_okay=False), help="Model for the rl policy.")
@click.option("--no-oracle", is_flag=True, help="Skip the ILP oracle (no distance to it).")
@click.option("--oracle-time-limit", type=click.FloatRange(0, None, min_open=True), default=30.0,
              show_default=True,
              help="Seconds per oracle solve; past it the answer is marked bounded.")
@click.option("--oracle-budget", type=click.FloatRange(0, None, min_open=True), default=300.0,
              show_default=True,
              help="Seconds for all oracle solves together (each gets its share of what is "
                   "left, at most --oracle-time-limit).")
@click.option("--oracle-groups", type=click.IntRange(1, None), default=256, show_default=True,
              help="At most this many groups of units (clustered by heat over time) in the "
                   "oracle's ILP.")
@click.option("--oracle-windows", type=click.IntRange(1, None), default=120, show_default=True,
              help="At most this many time windows in the oracle's ILP.")
@click.option("--sample", "sample_rates", metavar="RATE[,RATE...]",
              help="Replay each trace as a sampled one: each access seen with probability "
                   "RATE (1/1000 or 0.001; Bernoulli thinning). The policies see the samples, "
                   "the cost model charges every access; one table per rate.")
@click.option("--sample-of", type=click.Choice(["accesses", "counts"]), default="accesses",
              show_default=True,
              help="What --sample thins: the accesses a recorded count stands for "
                   "(--accesses-per-count), or the recorded counts themselves.")
@click.option("--seed", type=int, default=0, show_default=True,
              help="Seed of the --sample thinning.")
@click.option("--json", "as_json", is_flag=True, help="Print the runs as JSON.")
@click.option("-o", "--plot", "plot_path", type=click.Path(dir_okay=False),
              help="Write a plot of each run's time against the best static placement "
                   "(PNG, SVG or PDF).")
def bench_sim(traces, policies, capacities, preset, cost_file, fast_ns, slow_ns, migrate_us,
              migrate_mb_s, accesses_per_count, rate, placement, rl_model, no_oracle,
              oracle_time_limit, oracle_budget, oracle_groups, oracle_windows, sample_rates,
              sample_of, seed, as_json, plot_path):
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
      pagetier bench sim --sample 1/100,1/1000,1/10000 --policies lru,heuristic
    """
    from pagetier.policies.simulate import parse_sample_rate

    samples = None
    if sample_rates is not None:
        labels = sim.split_list(sample_rates)
        if not labels:
            raise ConfigError(f"--sample {sample_rates!r}: give a rate such as 1/1000 or 0.001")
        samples = [(lb, parse_sample_rate(lb)) for lb in labels]
    pols = sim.split_list(policies)
    if not pols:
        raise ConfigError(f"--policies {policies!r}: name at least one policy")
    if "rl" in pols and not rl_model:
        raise click.UsageError("policy rl needs --rl-model PATH")
    if rl_model and not Path(rl_model).is_file():
        raise ConfigError(f"--rl-model {rl_model}: no such model file (train one with "
                          "`pagetier train-rl`)")
    from pagetier.policies.base import known

    if "rl" in pols:
        import pagetier.policies.rl  # noqa: F401  registers "rl"
    for p in pols:
        if p not in known():
            raise click.UsageError(f"unknown policy {p!r} (known: {', '.join(known())})")
    cost = sim.cost_of_options(preset, fast_ns, slow_ns, migrate_us, migrate_mb_s,
                               accesses_per_count, cost_file)
    caps = capacity_list(capacities)
    if plot_path:
        check_output(plot_path, "-o", PLOT_SUFFIXES)
    if not traces:
        from pagetier.policies import builtin_traces

        traces = [f"builtin:{n}" for n in builtin_traces.names()]
    loaded = [sim.load_trace(t) for t in traces]
    n = len(loaded) * len(caps) * (len(pols) * len(samples or [None]) + (1 if no_oracle else 2))
    t0 = time.monotonic()
    with click.progressbar(length=n, label="simulating", file=sys.stderr) as bar:
        rows, statics = sim.run_bench(loaded, pols, caps, cost, rate=rate, placement=placement,
                             rl_model=rl_model, oracle=not no_oracle,
                             oracle_time_limit=oracle_time_limit, oracle_budget=oracle_budget,
                             oracle_groups=oracle_groups,
                             oracle_windows=oracle_windows, progress=lambda: bar.update(1),
                             samples=samples, seed=seed, sample_of=sample_of)
    if samples:
        found = [dict(x, sample=lb) for lb, _ in samples
                 for x in sim.losses(sim.sample_rows(rows, lb), statics)]
    else:
        found = sim.losses(rows, statics)
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
        if samples:
            click.echo(f"sampled: {sample_of} thinned at each rate (seed {seed}); the oracle "
                       "and static placement plan on the true counts")
            for lb, _ in samples:
                click.echo(sim.format_sample_table(rows, statics, lb))
                click.echo(sim.sample_summary(rows, statics, lb))
        else:
            click.echo(sim.format_table(rows, statics))
            note = sim.format_losses(found, statics, rows)
            if note:
                click.echo(note)
    if plot_path:
        if samples:  # a panel per trace and rate
            rows = [dict(r, trace=f"{r['trace']} @{r['sample']}") for r in rows if "sample" in r]
            statics = []
        sim.plot(rows + statics, plot_path)
        click.echo(f"plot written to {plot_path}", err=True)
    click.echo(f"{n} runs in {time.monotonic() - t0:.0f} s", err=True)


@command.command("traces")
@click.option("--json", "as_json", is_flag=True, help="Print the index as JSON.")
def bench_traces(as_json):
    """List the built-in trace set (real programs recorded in the test VM). Each is taken as
    builtin:NAME wherever a trace is (bench sim, train-rl, report, heatmap).

    \b
    Examples:
      pagetier bench traces
      pagetier bench sim builtin:redis builtin:torch-mlp
      pagetier report builtin:sqlite
      pagetier heatmap builtin:zstd --ascii
    """
    from pagetier.policies import builtin_traces

    if as_json:
        click.echo(json.dumps({n: {**d, "spec": f"builtin:{n}",
                                   "path": str(builtin_traces.path(n))}
                               for n, d in builtin_traces.index().items()}, indent=1))
    else:
        click.echo(builtin_traces.table())
        click.echo(f"give one as builtin:NAME (pagetier report builtin:{builtin_traces.names()[0]}"
                   f"); the files are in {builtin_traces.TRACE_DIR}")


@command.command("costmodel", context_settings={"ignore_unknown_options": True})
@click.option("--trace", "trace_path", required=True, type=click.Path(dir_okay=False),
              help="A trace of the same program (`pagetier record`): its counts per second.")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False),
              help="Where to write the cost model (JSON, for --cost-file).")
@click.option("--fast-node", type=int, default=0, show_default=True)
@click.option("--slow-node", type=int, default=1, show_default=True)
@click.option("--cpu-node", type=int, default=0, show_default=True,
              help="Node whose CPUs run the program in both runs (-1: no CPU binding).")
@click.option("--repeat", type=click.IntRange(1, None), default=3, show_default=True,
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

    check_output(output, "-o")
    tr = read_trace(resolve_trace(trace_path))
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


@command.command("live")
@click.option("--quick", is_flag=True,
              help=f"scenarios {','.join(live.QUICK_SCENARIOS)} "
                   f"(noise runs {live.QUICK_NOISE_SECONDS} s); baselines {live.QUICK_BASELINES}")
@click.option("--scenarios", "scenario_names",
              help="scenarios or families, comma-separated (default: all; --quick: its subset)")
@click.option("--policies", default=live.DEFAULT_POLICIES, show_default=True,
              help="pagetier policies to run, comma-separated ('' for none); "
                   "POLICY+KEY=VALUE+... runs one with policy options, e.g. "
                   "heuristic,heuristic+finish_change=false; +kmod.KNOB=N sets pagetier.ko's "
                   "sysfs knob for that configuration's runs, e.g. "
                   "heuristic,heuristic+kmod.probe_every=4")
@click.option("--baselines", help=f"of {','.join(live.BASELINES)} "
                                  f"[default: {live.DEFAULT_BASELINES}; "
                                  f"--quick: {live.QUICK_BASELINES}]")
@click.option("--kernel", "-k", default="6.12", show_default=True, help="6.12 or 6.1")
@click.option("--seconds", type=int, help="seconds per run, for every scenario (default: each "
                                          "scenario's own)")
@click.option("--mode", default="auto", show_default=True,
              help="pagetier.ko profiling mode: fault, abit, or auto (the daemon's default: "
                   "fault, with abit for targets mostly in 4 KiB pages: shmem, files, THP "
                   "off); several (auto,fault): each mode a configuration, "
                   "pagetier:POLICY@MODE, taking turns in one boot, a named fault or abit for "
                   "every target")
@click.option("--interval", type=float, help="the daemon's interval in pagetier's runs, s "
                                             "(default 1)")
@click.option("--repeat", type=click.IntRange(min=1), default=1, show_default=True,
              help="runs of each configuration in each scenario, taking turns; the tables show "
                   "their medians and list each run")
@click.option("--profiler-option", "-O", "profiler_opts", multiple=True, metavar="KEY=VALUE",
              help="a kmod profiler option for pagetier's runs (as the config's "
                   "profiler_options), e.g. -O kinds=off or -O sample_ratio=8")
@click.option("--list", "list_only", is_flag=True, help="list the scenarios and exit")
@click.option("--json", "as_json", is_flag=True, help="write only the results, as JSON, to stdout")
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="also write the results here")
@click.option("--configs", hidden=True, help="exactly these configurations, comma-separated")
@click.option("--in-guest", is_flag=True, hidden=True)
@click.option("--records", type=click.Path(dir_okay=False), hidden=True,
              help="print the table of a saved results file instead of running")
def bench_live(quick, scenario_names, policies, baselines, kernel, seconds, mode, interval,
               repeat, profiler_opts, list_only, as_json, output, configs, in_guest, records):
    """Compare pagetier's policies with the kernel's tiering, DAMOS and no migration, live in
    the two-node test VM (6.12: the slow node is a lower memory tier), in scenario families:
    noise (0, 10, 100, 1000 accesses per million anywhere, THP on and off), a fast node fuller
    than the budget, two regions alternating in phases. Figures are ratios to kernel tiering.

    \b
    Examples:
      pagetier bench live --quick
      pagetier bench live --scenarios noise -o noise.json
      pagetier bench live --scenarios phases,fuller --policies heuristic,lru
      pagetier bench live --quick --json
      pagetier bench live --scenarios noise1000,fuller --baselines kernel --repeat 3
      pagetier bench live --scenarios noise0-shmem --mode fault,abit --repeat 3
    """
    if output:
        check_output(output, "-o")
    if list_only:
        for s in live.scenarios().values():
            click.echo(f"{s.name:<16} {s.family:<7} {s.describe()}"
                       + ("  (quick)" if s.name in live.QUICK_SCENARIOS else ""))
        return
    popts = live.profiler_options(profiler_opts)
    modes = live.parse_modes(mode)
    specs = live.select_scenarios(scenario_names, quick=quick, seconds=seconds, mode=modes[0],
                                  interval=interval, profiler_options=popts)
    if baselines is None:
        baselines = live.QUICK_BASELINES if quick else live.DEFAULT_BASELINES
    names = live.config_names(policies, baselines, mode)
    if configs:
        names = [c.strip() for c in configs.split(",") if c.strip()]
        bad = [c for c in names if c not in live.BASELINES and not c.startswith("pagetier:")]
        if bad:
            raise ConfigError(f"bench live: unknown configuration {bad[0]!r}")
    if in_guest or in_guest_env():
        if not output:
            raise ConfigError("bench live --in-guest needs -o")
        sys.exit(live.guest_main(names, specs, Path(output),
                                 log=lambda m: click.echo(m, err=True), repeat=repeat))
    argv = ["pagetier", *sys.argv[1:]]
    if records:
        doc = json.loads(Path(records).read_text())
    else:
        if not names:
            raise ConfigError("bench live: nothing to run (no policy and no baseline)")
        doc = live.run_in_vm(names, specs, kernel, quick=quick, seconds=seconds, mode=modes[0],
                             echo=not as_json, interval=interval, repeat=repeat,
                             profiler_options=popts)
    doc["command"] = shlex.join(argv)
    rows = live.results(doc)
    if output:
        Path(output).write_text(json.dumps({**doc, "rows": rows}, indent=1))
    if as_json:
        click.echo(json.dumps({"command": doc["command"], "kernel": doc["kernel"],
                               "scenarios": [sc["spec"] for sc in doc["scenarios"]],
                               "vm_seconds": doc.get("vm_seconds"), "repeat": doc.get("repeat", 1),
                               "kernel_reports": doc.get("kernel_reports", []), "rows": rows}))
    else:
        click.echo(live.report(doc, doc["command"]))
    if doc.get("kernel_reports"):
        sys.exit(1)
