"""``pagetier train-rl``: train the rl policy's model on traces (policies/rl.py trains it)."""
from __future__ import annotations

import sys
import time

import click

from pagetier.bench import sim
from pagetier.bench.sim import cost_of_options
from pagetier.cli import check_output
from pagetier.cli.bench import capacity_list, cost_options


@click.command("train-rl")
@click.argument("traces", nargs=-1, required=True)
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False),
              help="Where to write the model (.npz).")
@click.option("--budget", default="10%,25%,50%", show_default=True,
              help="Fast-tier capacities to train for, as % of each trace's footprint.")
@click.option("--epochs", type=click.IntRange(1, None), default=20, show_default=True)
@click.option("--population", type=click.IntRange(2, None), default=24, show_default=True,
              help="Candidates per cross-entropy-method epoch.")
@click.option("--chunks", type=click.IntRange(1, None), default=32, show_default=True,
              help="Address chunks.")
@click.option("--history", type=click.IntRange(1, None), default=4, show_default=True,
              help="Intervals of heat in the observation.")
@click.option("--seed", type=int, default=0, show_default=True)
@cost_options
def command(traces, output, budget, epochs, population, chunks, history, seed, preset, cost_file,
             fast_ns, slow_ns, migrate_us, migrate_mb_s, accesses_per_count, rate, placement):
    """Train the rl policy's model on TRACES and write it to MODEL.

    \b
    Examples:
      pagetier train-rl synth:hotcold synth:phased synth:scan -o rl.npz
      pagetier train-rl a.trace b.trace -o rl.npz --budget 25% --epochs 40
      pagetier run --policy rl --policy-option model=rl.npz -- ./job
    """
    from pagetier.policies import rl

    check_output(output, "-o")  # before the training, not after it
    caps = [float(c[:-1]) / 100.0 for c in capacity_list(budget, "--budget", sizes=False)]
    cost = cost_of_options(preset, fast_ns, slow_ns, migrate_us, migrate_mb_s, accesses_per_count,
                           cost_file)
    loaded, costs = [], []
    for t in traces:
        _, frames, interval_s = sim.load_trace(t)
        loaded.append(frames)
        costs.append(sim.for_trace(cost, frames, interval_s))
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
