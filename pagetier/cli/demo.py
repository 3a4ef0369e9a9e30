"""`pagetier demo`: the whole path on the built-in default, in the two-node test VM.

Boots the VM, loads pagetier.ko, starts the built-in workload with its 64 MiB hot part first
touched on the slow node (1) and a 192 MiB cold part, runs the daemon on it under a 96 MiB
fast-node budget, and prints what moved and where the hot pages ended up. It needs a checkout
set up by scripts/setup.sh: the VM is the checkout's (scripts/testvm.py, see pagetier.checkout).
"""
from __future__ import annotations

import json
import shlex
import subprocess
import sys

import click

from pagetier.checkout import in_guest as in_guest_env, test_vm


def guest_demo(seconds: int, budget: str, mode: str) -> int:
    """Runs inside the VM: the daemon managing the workload; a summary from both JSON streams."""
    from pagetier.profiler import kmod

    kmod.load_module()
    click.echo(f"pagetier.ko {(kmod.SYSFS / 'version').read_text().strip()} loaded; "
               f"profiling mode {mode}")
    cmd = ["pagetier", "run", "--fast-budget", budget, "--interval", "1", "--json",
           "--profiler-option", f"mode={mode}",
           "--", "pagetier", "workload", "--size", "256", "--hot", "64", "--hot-offset", "96",
           "--start-node", "1", "--duration", str(seconds)]
    click.echo("$ " + shlex.join(cmd))
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    moved_mb = 0.0
    promoted = demoted = 0
    ticks, stats = [], []
    click.echo(f"{'t':>4} {'hot on fast':>11} {'promoted':>9} {'demoted':>8} {'fast used':>10}"
               "   (moves so far)")
    last = {}
    for line in proc.stdout:
        try:
            ev = json.loads(line)
        except json.JSONDecodeError:
            click.echo(line.rstrip())
            continue
        if ev.get("event") == "tick":
            ticks.append(ev)
            click.echo(f"{ev['t']:>4.0f} {ev['fast_fraction'] * 100:>10.1f}% "
                       f"{promoted * 4 / 1024:>7.1f}MB "
                       f"{demoted * 4 / 1024:>6.1f}MB "
                       f"{last.get('fast_used', 0) / 2**20:>8.1f}MB")
        elif ev.get("event") == "done":
            done = ev
        elif "interval" in ev:
            stats.append(ev)
            last = ev
            promoted += ev["promoted"]
            demoted += ev["demoted"]
            moved_mb += ev["bytes_moved"] / 2**20
    rc = proc.wait()
    final = ticks[-1]["fast_fraction"] if ticks else 0.0
    worst = max((s["fast_used"] for s in stats), default=0)
    click.echo("")
    click.echo(f"moved {moved_mb:.1f} MB: {promoted * 4 / 1024:.1f} MB promoted to node 0, "
               f"{demoted * 4 / 1024:.1f} MB demoted to node 1, "
               f"{sum(s['ping_pongs'] for s in stats)} ping-pongs")
    click.echo(f"hot pages on the fast node at the end: {final * 100:.1f}% "
               f"(start: {ticks[0]['fast_fraction'] * 100 if ticks else 0:.1f}%)")
    click.echo(f"fast-node use by the workload peaked at {worst / 2**20:.1f} MB "
               f"(budget {budget})")
    if ticks:
        t95 = next((t["t"] for t in ticks if t["fast_fraction"] >= 0.95), None)
        click.echo("hot set reached the fast node (95%) after "
                   + (f"{t95:.0f} s" if t95 is not None else "-- not within the run"))
    if "done" in locals():
        click.echo(f"workload memory check: {done['pages_checked']} pages, "
                   f"{done['pages_corrupt']} corrupt")
    kmod.unload_module()
    return rc


@click.command("demo")
@click.option("--kernel", "-k", default="6.12", show_default=True, help="6.1 or 6.12")
@click.option("--seconds", default=25, show_default=True, help="how long the workload runs")
@click.option("--fast-budget", default="96M", show_default=True)
@click.option("--mode", type=click.Choice(["fault", "abit"]), default="fault", show_default=True)
@click.option("--in-guest", is_flag=True, hidden=True)
def command(kernel, seconds, fast_budget, mode, in_guest):
    """Boot the test VM and show the daemon moving a workload's hot pages to the fast node."""
    if in_guest or in_guest_env():
        sys.exit(guest_demo(seconds, fast_budget, mode))
    from pagetier.workload import binary

    vm = test_vm()
    binary()
    click.echo(f"booting the two-node test VM ({kernel}; node 0 fast with the CPUs, node 1 slow)...")
    res = vm.run(f"pagetier demo --in-guest --seconds {seconds} --fast-budget {fast_budget} "
                 f"--mode {mode}", kernel=kernel, echo=True, timeout=600 + seconds)
    for r in res.reports:
        click.echo(f"kernel report: {r}", err=True)
    click.echo(f"[VM {res.kernel}: exit {res.returncode}, {res.seconds:.0f} s, "
               f"dmesg {'clean' if not res.reports else 'NOT clean'}]")
    sys.exit(0 if res.ok else 1)
