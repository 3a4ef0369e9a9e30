"""What ``pagetier bench live`` runs (its command is in pagetier/cli/bench.py): pagetier's
policies against the kernel's own tiering, DAMON's tiering schemes and no migration, side by
side, on the built-in workload in the two-node test VM, in scenario families, with every figure
also a ratio to kernel tiering in the same scenario.

On the host it boots the VM once (6.12 by default, with the slow node described through HMAT as a
lower memory tier) and runs itself inside (``--in-guest``). Inside, each configuration of each
scenario runs in turn against a fresh workload (hotcold.c) whose pages are all first touched on
the slow node. The scenarios (``scenarios()``):

- noise: a 64 MiB hot set in 256 MiB, with 0, 10, 100 or 1000 of every million accesses sent to a
  random page anywhere, THP on and off: does the placement hold once cold pages look warm too?
- fuller: the fast node has less free memory than the budget, and the hot window moves: the new
  hot window fits only if the old one makes room (the node, not the budget, is the limit);
- phases: the hot window alternates between two regions that do not both fit;
- shmem and file: noise0, noise100, fuller and phases again (``NAME-shmem``, ``NAME-file``) with
  the workload's buffer in shared memory (MAP_SHARED|MAP_ANONYMOUS), or a file mapped
  MAP_SHARED on an ext4 the guest mounts for the run (FileSystem: /tmp is a tmpfs, whose pages
  are shmem), dirtied as the hot part is written, read back and checked at the end. The report
  sets each beside the same scenario on anonymous memory (format_kinds). private: noise0 on a
  file mapped MAP_PRIVATE (``noise0-private``), every page written once first, so the buffer
  is the process's own 4 KiB copies of the file's pages (anonymous memory in a file VMA); the
  file, never written through the mapping, is checked too;
- families not tuned on: nothp (phases and fuller with 4 KiB pages), sweep (phases with the hot
  part swept in address order, a cache line per page, no THP), preferred (that sweep under
  ``numactl --preferred=SLOW``: the kernel's NUMA balancing takes no hinting faults for such a
  policy, so kernel tiering cannot promote and pagetier's row is pagetier alone) and programs
  (stress-ng's vm stressor and sysbench's memory test, Debian packages, in the place of
  hotcold: ProgramRun; their memory's share on the fast node from numa_maps and their own
  throughput figure, set beside kernel tiering's and no migration's by format_programs).

Before the workload starts its accesses (it waits for SIGUSR1), the manager is set up, and the
fast node's free memory is cut to the same size for every configuration by reserving the rest as
2 MiB hugetlb pages (which nothing can migrate or reclaim): the scenario's free memory (its
budget unless it says less) plus the node's promotion watermark, below which the kernel stops
promoting. pagetier's daemon gets the budget as ``--fast-budget``.

Configurations: ``none`` (numa_balancing 0, no demotion), ``pagetier:POLICY`` (the daemon, forked
from the bench process with the same Daemon and config a ``pagetier attach`` would build, on
pagetier.ko; ``POLICY+KEY=VALUE`` with a policy option, to compare settings in one boot), ``kernel`` (numa_balancing 2 with demotion: see kernel_tiering.KernelTiering)
and ``damos`` (kernel_tiering.DamosTiering). One that cannot run here is listed with the reason.

Measured every TICK_MS (a second): the workload's own report of the share of its hot part on
the fast node and of its accesses served there (its move_pages look at the hot part, so t95 is
a whole number of ticks: a hot set there 1.1 s after its phase began counts as 2 s). A finer
look perturbs what it measures: at 250 ms, noise1000 (THP) moved 254-386 MB in four runs
against 94-99 MB at 1 s. Each second: where the workload's pages are (move_pages queries of
one page in TRACK_STRIDE), hence MB on the fast node, pages moved and ping-pongs (a page moved back to the
node it left within PING_PONG_S), scaled up from that sample; /proc/vmstat counters (all
migrations in the guest); CPU time of whatever decides and moves (the daemon process, kswapd,
the kdamonds) and of pagetier.ko's scans. live_table.py turns it into the tables.
"""
from __future__ import annotations

import json
import os
import select
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from pagetier.bench import kernel_tiering, live_table
from pagetier.checkout import test_vm
from pagetier.daemon import config as config_mod
from pagetier.errors import ConfigError, PagetierError

DEFAULT_POLICIES = "heuristic"
DEFAULT_BASELINES = "kernel,damos,none"
QUICK_BASELINES = "kernel,none"
BASELINES = ("none", "kernel", "damos")
PING_PONG_S = 10.0
TRACK_STRIDE = 8  # the page tracker looks at one 4 KiB page in this many (see PageTracker)
PAGE = 4096
# the workload reports where its hot part is every TICK_MS: the resolution of t95 (finer
# looks changed the placement they measured: see the module's docstring)
TICK_MS = 1000
HUGE = 2 << 20
FAST, SLOW = 0, 1
RESULT_NAME = "bench-live.json"
# the kinds of memory a scenario's workload can have (hotcold --memory)
MEMORY_KINDS = ("anon", "shmem", "file", "private")
MEMORY_DESCRIPTIONS = {"anon": "", "shmem": " of shared memory (MAP_SHARED|MAP_ANONYMOUS)",
                       "file": " of a file on ext4, MAP_SHARED",
                       "private": " of a file on ext4, MAP_PRIVATE, every page written (copies)"}
FILE_KINDS = ("file", "private")  # kinds whose buffer is a file on the run's ext4
KIND_SCENARIOS = ("noise0", "noise100", "fuller", "phases")  # also run on each other kind
# a private file mapping's written pages are anonymous 4 KiB copies in a file VMA: the same
# scenarios (kinds auto chooses abit for them as for every 4 KiB kind)
PRIVATE_SCENARIOS = KIND_SCENARIOS
PATTERNS = ("random", "sweep")  # hotcold --pattern
# third-party programs a scenario may run instead of hotcold: the command for a Spec. Neither
# has a hot part known beforehand: bench live measures their memory's share on the fast node
# (/proc/PID/numa_maps) and their own throughput figure (ProgramRun).
# A program is told to run PROGRAM_SLACK_S longer than the scenario: its clock starts before
# the manager is set up (pagetier's daemon takes seconds to start under emulation), so the
# bench ends it with SIGINT ``seconds`` after the run's start instead (stress-ng prints its
# metrics then; sysbench's once-a-second reports are read from the run's start on).
PROGRAM_SLACK_S = 600
PROGRAMS = {
    # one vm worker keeping one mapping (--vm-keep), reading and writing it at random
    "stress-ng-vm": lambda s: ["stress-ng", "--vm", "1", "--vm-bytes", f"{s.size_mb}M",
                               "--vm-keep", "--vm-method", "rand-sum", "--timeout",
                               f"{s.seconds + PROGRAM_SLACK_S}s", "--metrics-brief"],
    # one thread writing a block at random offsets, over and over, a report every second
    "sysbench-memory": lambda s: ["sysbench", "memory", f"--memory-block-size={s.size_mb}M",
                                  "--memory-total-size=100000G", "--memory-access-mode=rnd",
                                  f"--time={s.seconds + PROGRAM_SLACK_S}",
                                  "--report-interval=1", "run"],
}
VMSTAT_KEYS = ("pgmigrate_success", "pgpromote_success", "pgdemote_kswapd", "pgdemote_direct",
               "numa_hint_faults", "thp_migration_success", "thp_migration_split",
               "thp_migration_fail", "thp_split_page")


@dataclass
class Spec:
    """One scenario: the workload, the fast capacity, how long (the same for every
    configuration)."""
    name: str = "custom"
    family: str = ""
    seconds: int = 60
    phase: int = 0
    size_mb: int = 256
    hot_mb: int = 64
    budget_mb: int = 96
    node_free_mb: int | None = None  # free on the fast node above its promotion watermark
    noise_ppm: int = 0
    thp: bool = True
    cold_rate: int = 0
    mode: str = "fault"
    scan_period_ms: int | None = None  # None: the daemon's default (a quarter of interval_s)
    interval_s: float = 1.0  # the daemon's --interval in pagetier's runs
    # the kmod profiler's options in pagetier's runs besides mode and scan_period_ms (-O)
    profiler_options: dict = field(default_factory=dict)
    memory: str = "anon"  # the workload's buffer: anon, shmem or file (MEMORY_KINDS)
    pattern: str = "random"  # hotcold --pattern: random 8-byte updates, or a sweep in address order
    # the workload started under ``numactl --preferred=SLOW`` (the kernel's NUMA balancing
    # takes no hinting faults for it: pagetier moves alone)
    preferred_slow: bool = False
    # a third-party program instead of hotcold (PROGRAMS); size_mb is its memory
    program: str = ""

    def check(self) -> None:
        if self.pattern not in PATTERNS:
            raise ConfigError(f"bench live: pattern must be one of {', '.join(PATTERNS)}, "
                              f"got {self.pattern!r}")
        if self.program and self.program not in PROGRAMS:
            raise ConfigError(f"bench live: unknown program {self.program!r} (known: "
                              f"{', '.join(PROGRAMS)})")
        if self.memory not in MEMORY_KINDS:
            raise ConfigError(f"bench live: memory must be one of {', '.join(MEMORY_KINDS)}, "
                              f"got {self.memory!r}")
        if self.seconds < 2 or self.phase < 0:
            raise ConfigError("bench live: --seconds must be >= 2 and --phase >= 0")
        if not (0 < self.hot_mb <= self.size_mb):
            raise ConfigError("bench live: need 0 < hot <= size")
        if self.budget_mb <= 0 or self.free_mb() <= 0:
            raise ConfigError("bench live: the fast budget and the node's free memory must be > 0")
        if not 0.1 <= self.interval_s <= self.seconds / 2:
            raise ConfigError(f"bench live: --interval must be in [0.1, {self.seconds / 2:g}] s "
                              f"for {self.name!r} ({self.seconds} s), got {self.interval_s:g}")

    def free_mb(self) -> int:
        """What the fast node has free (above its promotion watermark) when a run starts."""
        return self.budget_mb if self.node_free_mb is None else self.node_free_mb

    def workload_args(self, file: Path | None = None) -> list[str]:
        """hotcold's arguments; ``file``: the path of a file-mapped scenario's file."""
        args = ["--size", str(self.size_mb), "--hot", str(self.hot_mb), "--start-node", str(SLOW),
                "--fast-node", str(FAST), "--duration", str(self.seconds), "--phase",
                str(self.phase), "--tick-ms", str(TICK_MS), "--wait"]
        if self.memory != "anon":
            args += ["--memory", f"{self.memory}:{file}" if self.memory in FILE_KINDS
                     else self.memory]
        if self.noise_ppm:
            args += ["--noise-ppm", str(self.noise_ppm)]
        if self.cold_rate:
            args += ["--cold-rate", str(self.cold_rate)]
        if not self.thp:
            args.append("--no-thp")
        if self.pattern != "random":
            args += ["--pattern", self.pattern]
        return args

    def prefix(self) -> list[str]:
        """What the workload is started under: numactl --preferred=SLOW, or nothing."""
        return ["numactl", f"--preferred={SLOW}"] if self.preferred_slow else []

    def program_argv(self) -> list[str]:
        """A third-party program's command line (PROGRAMS), run for ``seconds``."""
        return PROGRAMS[self.program](self)

    def describe(self) -> str:
        if self.program:
            return (f"`{' '.join(self.program_argv())}` ({self.size_mb} MiB), first touched on "
                    f"node {SLOW} under the default policy (node {FAST} full until it has its "
                    f"memory); budget {self.budget_mb} MiB; {self.seconds} s")
        what = [f"{self.size_mb} MiB{MEMORY_DESCRIPTIONS[self.memory]}, hot {self.hot_mb} MiB"]
        if self.phase:
            what.append(f"moving every {self.phase} s")
        if self.noise_ppm:
            what.append(f"noise {self.noise_ppm} ppm")
        if self.cold_rate:
            what.append(f"cold touches {self.cold_rate}/s")
        if self.memory == "anon":  # shmem and page cache are 4 KiB pages here
            what.append("THP" if self.thp else "no THP")
        if self.pattern == "sweep":
            what.append("swept in address order, a cache line per page")
        if self.preferred_slow:
            what.append(f"under numactl --preferred={SLOW}")
        free = "" if self.node_free_mb is None else f", node free {self.node_free_mb} MiB"
        every = "" if self.interval_s == 1.0 else f"; pagetier interval {self.interval_s:g} s"
        return f"{', '.join(what)}; budget {self.budget_mb} MiB{free}; {self.seconds} s{every}"


def scenarios() -> dict[str, Spec]:
    """The built-in scenarios, by name (see the module's docstring)."""
    out = {}
    for ppm in (0, 10, 100, 1000):
        for thp in (True, False):
            name = f"noise{ppm}" + ("" if thp else "-nothp")
            out[name] = Spec(name, "noise", seconds=60, size_mb=256, hot_mb=64, budget_mb=96,
                             noise_ppm=ppm, thp=thp)
    out["fuller"] = Spec("fuller", "fuller", seconds=45, phase=15, size_mb=256, hot_mb=80,
                         budget_mb=128, node_free_mb=104)
    # 3 x hot: the hot part's window goes A, B, C, then (hotcold wraps it modulo size - hot + 1)
    # back to B and C less a page each time: after the first phase, two regions alternate
    out["phases"] = Spec("phases", "phases", seconds=30, phase=5, size_mb=288, hot_mb=96,
                         budget_mb=128)
    # families not tuned on: THP off (4 KiB pages); the hot part swept in address order; a
    # program under numactl --preferred=SLOW, where the kernel's tiering cannot promote
    for base in ("phases", "fuller"):
        s = replace(out[base], name=f"{base}-nothp", family="nothp", thp=False)
        out[s.name] = s
    out["phases-sweep"] = replace(out["phases"], name="phases-sweep", family="sweep",
                                  thp=False, pattern="sweep")
    out["phases-preferred"] = replace(out["phases"], name="phases-preferred",
                                      family="preferred", thp=False, pattern="sweep",
                                      preferred_slow=True)
    # third-party programs (Debian packages stress-ng, sysbench): all their memory fits in
    # the budget, so the best placement has all of it on the fast node (sysbench takes only a
    # power of two for its block size)
    for prog, mb in (("stress-ng-vm", 96), ("sysbench-memory", 64)):
        out[prog] = Spec(prog, "programs", seconds=30, size_mb=mb, hot_mb=mb, budget_mb=128,
                         thp=False, program=prog)
    # the same scenarios on shared memory and on a shared file mapping: families shmem, file
    for kind in MEMORY_KINDS[1:]:
        for base in PRIVATE_SCENARIOS if kind == "private" else KIND_SCENARIOS:
            s = replace(out[base], name=f"{base}-{kind}", family=kind, memory=kind)
            out[s.name] = s
    return out


QUICK_SCENARIOS = ("noise0", "noise100", "fuller", "phases")
QUICK_NOISE_SECONDS = 40


PROFILER_OPTIONS = ("kinds", "sample_ratio", "page_budget",
                    "granularity")


def profiler_options(pairs) -> dict:
    """``-O KEY=VALUE`` pairs as kmod profiler options (integers where they are digits); a
    key the bench does not pass on is an error."""
    out = {}
    for kv in pairs:
        k, eq, v = kv.partition("=")
        k = k.strip().replace("-", "_")
        if not eq or k not in PROFILER_OPTIONS:
            raise ConfigError(f"bench live: -O {kv!r}: give KEY=VALUE with KEY one of "
                              f"{', '.join(PROFILER_OPTIONS)}")
        v = v.strip()
        out[k] = int(v) if v.isdigit() else v
    return out


def select_scenarios(names: str | None, quick: bool = False, seconds: int | None = None,
                     mode: str = "fault", interval: float | None = None,
                     profiler_options: dict | None = None) -> list[Spec]:
    """Scenarios by name or family ('noise' is all eight noise scenarios), in the order given;
    None: all (--quick: the quick subset, noise runs cut to QUICK_NOISE_SECONDS)."""
    table = scenarios()
    if names is None:
        picked = list(QUICK_SCENARIOS) if quick else list(table)
    else:
        picked = []
        for n in filter(None, (x.strip() for x in names.split(","))):
            fam = [k for k, s in table.items() if s.family == n]
            if n in table:
                fam = [n]
            if not fam:
                fams = sorted({s.family for s in table.values()})
                raise ConfigError(f"bench live: unknown scenario {n!r} (scenarios: "
                                  f"{', '.join(table)}; families: {', '.join(fams)})")
            picked += [k for k in fam if k not in picked]
    out = []
    for n in picked:
        s = table[n]
        if quick and s.family == "noise":
            s.seconds = min(s.seconds, QUICK_NOISE_SECONDS)
        if seconds is not None:
            s.seconds = seconds
        s.mode = mode
        if interval is not None:
            s.interval_s = float(interval)
        s.profiler_options = dict(profiler_options or {})
        s.check()
        out.append(s)
    return out


# "auto": the daemon's default, fault mode with kinds auto (abit for a target that is mostly
# in 4 KiB pages: shmem, page cache, private copies, anonymous without THP); "fault", "abit":
# that mode for every target
# (kinds off) where a configuration names it (pagetier:POLICY@MODE)
MODES = ("fault", "abit", "auto")


def parse_modes(modes: str) -> list[str]:
    """``--mode``: one pagetier.ko mode, or several comma-separated (each its own
    configuration in every scenario, ``pagetier:POLICY@MODE``)."""
    out = []
    for m in filter(None, (x.strip() for x in modes.split(","))):
        if m not in MODES:
            raise ConfigError(f"bench live: unknown mode {m!r} (known: {', '.join(MODES)}; "
                              "several comma-separated)")
        if m not in out:
            out.append(m)
    if not out:
        raise ConfigError(f"bench live: --mode needs one of {', '.join(MODES)}")
    return out


def config_mode(name: str, spec: Spec) -> tuple[str, str]:
    """A pagetier configuration's policy and kmod mode: ``pagetier:POLICY@MODE``, or
    ``pagetier:POLICY`` in the scenario's mode."""
    policy, _, mode = name.split(":", 1)[1].partition("@")
    return policy, mode or spec.mode


def daemon_profiler_options(name: str, spec: Spec) -> dict:
    """The kmod profiler options of configuration ``name``'s daemon: the scenario's (-O), its
    mode, and with a mode the configuration names (``@fault``, ``@abit``) that mode for every
    target (kinds off, unless -O gave kinds); ``auto`` (named or the scenario's) and a plain
    ``pagetier:POLICY`` in fault or abit mode leave kinds to the daemon's default."""
    _, mode = config_mode(name, spec)
    out = {**spec.profiler_options, "mode": "fault" if mode == "auto" else mode}
    if "@" in name and mode != "auto":
        out.setdefault("kinds", "off")
    if spec.scan_period_ms is not None:
        out["scan_period_ms"] = spec.scan_period_ms
    return out


KNOB_PREFIX = "kmod."  # a --policies option that is pagetier.ko's sysfs knob, not the policy's


def policy_spec(text: str) -> tuple[str, dict]:
    """A ``--policies`` entry: ``POLICY`` or ``POLICY+KEY=VALUE+...`` (the policy's options, as
    the config's policy_options), e.g. ``heuristic+finish_change=false``: (name, options).
    Keys ``kmod.KNOB`` are pagetier.ko's sysfs knobs for that configuration's runs
    (:func:`kmod_knobs`), kept in the options under that name."""
    name, *pairs = text.split("+")
    out = {}
    for kv in pairs:
        k, eq, v = kv.partition("=")
        if not eq or not k.strip():
            raise ConfigError(f"bench live: --policies {text!r}: give POLICY+KEY=VALUE, got "
                              f"{kv!r}")
        k = k.strip().replace("-", "_")
        if k.startswith(KNOB_PREFIX):
            knob = k[len(KNOB_PREFIX):]
            if not knob.isidentifier() or not v.strip().isdigit():
                raise ConfigError(f"bench live: --policies {text!r}: {kv!r}: give "
                                  f"{KNOB_PREFIX}KNOB=N, a knob of {kmod_sysfs()} and a whole "
                                  "number")
            out[k] = v.strip()
            continue
        out[k] = config_mod.parse_value(v.strip())
    return name.strip(), out


def kmod_knobs(options: dict) -> tuple[dict, dict]:
    """(the policy's options, pagetier.ko's knobs: name -> value) of policy_spec's options."""
    knobs = {k[len(KNOB_PREFIX):]: v for k, v in options.items() if k.startswith(KNOB_PREFIX)}
    return {k: v for k, v in options.items() if not k.startswith(KNOB_PREFIX)}, knobs


def kmod_sysfs() -> Path:
    from pagetier.profiler import kmod

    return kmod.SYSFS


def check_kmod_knobs(names: list[str]) -> None:
    """A ConfigError naming the first pagetier configuration of ``names`` whose kmod knob the
    loaded module has not."""
    for n in (n for n in names if n.startswith("pagetier:")):
        _, knobs = kmod_knobs(policy_spec(n.split(":", 1)[1].partition("@")[0])[1])
        _check_knobs(knobs, f"{n}: ")


def _check_knobs(knobs: dict, what: str = "") -> None:
    """A ConfigError naming the first of ``knobs`` the loaded pagetier.ko has not."""
    root = kmod_sysfs()
    bad = [k for k in knobs if not (root / k).is_file()]
    if bad:
        raise ConfigError(f"bench live: {what}pagetier.ko has no knob {bad[0]!r} "
                          f"({root / bad[0]} does not exist)")


def set_kmod_knobs(knobs: dict) -> dict:
    """Write pagetier.ko's sysfs ``knobs``; returns their values before, for
    :func:`set_kmod_knobs` to put back. A knob the module has not is an error naming it, with
    nothing written."""
    _check_knobs(knobs)
    root = kmod_sysfs()
    old = {k: (root / k).read_text().strip() for k in knobs}
    done = {}
    try:
        for k, v in knobs.items():
            (root / k).write_text(str(v))
            done[k] = old[k]
    except OSError as e:
        set_kmod_knobs(done)
        raise ConfigError(f"bench live: cannot set pagetier.ko's {k} to {v}: {e}") from None
    return old


def config_names(policies: str, baselines: str = DEFAULT_BASELINES,
                 modes: str = "fault") -> list[str]:
    """kernel first (the others' ratios are to it), pagetier:POLICY for each policy (with more
    than one mode, pagetier:POLICY@MODE for each, the policies' runs taking turns with the
    baselines' in one boot), then damos and none, as far as asked for."""
    from pagetier.policies import base

    want = [b.strip() for b in baselines.split(",") if b.strip()]
    bad = [b for b in want if b not in BASELINES]
    if bad:
        raise ConfigError(f"bench live: unknown baseline {bad[0]!r} (known: {', '.join(BASELINES)})")
    names = ["kernel"] if "kernel" in want else []
    for p in filter(None, (x.strip() for x in policies.split(","))):
        name, options = policy_spec(p)
        if name not in base.known():
            raise ConfigError(f"bench live: unknown policy {name!r} (known: {', '.join(base.known())})")
        options, _ = kmod_knobs(options)
        if options:
            from pagetier.policies import create

            try:
                create(name, options)
            except ConfigError as e:
                raise ConfigError(f"bench live: --policies {p!r}: {e}") from None
        ms = parse_modes(modes)
        names += [f"pagetier:{p}@{m}" for m in ms] if len(ms) > 1 else [f"pagetier:{p}"]
    return names + [b for b in ("damos", "none") if b in want]


# ------------------------------------------------------------------ guest side: the pieces
RESERVE_STEP = 32  # huge pages (64 MiB) per write to nr_hugepages


class FastCapacity:
    """Leaves about ``free`` bytes free on a node by reserving the rest as 2 MiB hugetlb pages."""

    def __init__(self, node: int = FAST):
        self.node = node
        self.path = Path(f"/sys/devices/system/node/node{node}/hugepages/hugepages-2048kB/nr_hugepages")

    def free(self) -> int:
        from pagetier.daemon.config import node_meminfo

        return node_meminfo(self.node)["MemFree"]

    def set(self, free: int) -> int:
        """Reserve until MemFree is within 2 MiB of ``free``; return the MemFree reached.

        A reservation takes its memory at once, but a released huge page may come back to MemFree
        only later (6.12 frees them from a worker), and the allocator's own use moves MemFree too.
        So each step waits for MemFree to settle, and the approach is from above: most of the way
        in one step, the rest a page at a time."""
        if not self.path.exists():
            raise PagetierError(f"no {self.path}: the kernel lacks 2 MiB hugetlb pages")
        have = self.free()
        for _ in range(40):
            diff = (have - free) // HUGE
            if abs(have - free) < HUGE:
                break
            if diff > 8:
                diff -= 4  # slack for what the allocator takes besides the pages
            cur = int(self.path.read_text())
            want = max(0, cur + diff)
            if want == cur:
                break
            self._reserve(cur, want)
            have = self._settled()
        return have

    def _reserve(self, cur: int, want: int) -> None:
        """Move the node's huge page count from ``cur`` to ``want``, RESERVE_STEP pages per
        write: one write of ~480 pages (zeroed at allocation) kept a vCPU in the kernel long
        enough for the soft-lockup watchdog under emulation (26 s, 6.12 guest)."""
        while cur != want:
            step = max(-RESERVE_STEP, min(RESERVE_STEP, want - cur))
            self.path.write_text(f"{cur + step}\n")
            got = int(self.path.read_text())
            if got == cur:  # the kernel found no more pages: stop here
                break
            cur = got

    def _settled(self, timeout: float = 5.0) -> int:
        """MemFree once two looks 0.1 s apart agree within 256 KiB (or after ``timeout``)."""
        last = self.free()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            time.sleep(0.1)
            now = self.free()
            if abs(now - last) < 256 << 10:
                return now
            last = now
        return last

    def release(self) -> None:
        if self.path.exists():
            self.path.write_text("0\n")


class FileSystem:
    """A disk-backed file system for the file-mapped scenarios: ext4 made in an image file and
    mounted through a loop device. The guest's /tmp is a tmpfs, whose pages are shmem, not page
    cache of a file system that writes back; ext4 migrates dirty page cache without writing it
    back. The image's own pages (tmpfs, behind the loop device) are allocated whole on the slow
    node before it is made, so that writeback during a run takes no memory of the fast node."""

    def __init__(self, size_mb: int, root: Path = Path("/tmp/pagetier-live")):
        self.size_mb, self.root = size_mb, root
        self.image, self.mnt = root / "ext4.img", root / "mnt"
        self.mounted = False

    def __enter__(self) -> Path:
        self.root.mkdir(parents=True, exist_ok=True)
        self.mnt.mkdir(exist_ok=True)
        bind = ["numactl", f"--membind={SLOW}"] if shutil.which("numactl") else []
        self._sh([*bind, "fallocate", "-l", f"{self.size_mb}M", str(self.image)])
        self._sh(["modprobe", "-q", "loop"], check=False)
        self._sh(["modprobe", "-q", "ext4"], check=False)
        self._sh(["mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0",
                  str(self.image)])
        self._sh(["mount", "-o", "loop", str(self.image), str(self.mnt)])
        self.mounted = True
        return self.mnt

    def __exit__(self, *exc) -> None:
        if self.mounted:
            self._sh(["umount", str(self.mnt)], check=False)
            self.mounted = False
        self.image.unlink(missing_ok=True)

    @staticmethod
    def _sh(argv: list[str], check: bool = True) -> None:
        p = subprocess.run(argv, capture_output=True, text=True)
        if check and p.returncode != 0:
            raise PagetierError(f"{' '.join(argv)}: {(p.stderr or p.stdout).strip()[:200]}")


class PageTracker:
    """Where the workload's buffer is, once a second: MB on the fast node, pages moved and
    ping-pongs, from one 4 KiB page in every ``stride`` (TRACK_STRIDE), scaled up.

    Querying every page (65,536 in 256 MiB) cost 0.17 s of a vCPU a second in the test VM and
    made the daemon's move_pages take twice as long (64 MiB of THP in 4.6 s against 2.2 s): the
    bench slowed the manager it measured, a process, more than the kernel's promotion in the
    workload's own faults. One page in 8 costs 0.02 s; with THP every 2 MiB page still has 64
    of its pages looked at, without THP the figures are estimates of the same sampling error
    for every configuration."""

    def __init__(self, pid: int, addr: int, size: int, window_s: float = PING_PONG_S,
                 stride: int | None = None):
        import numpy as np

        self.np = np
        self.pid, self.window = pid, window_s
        self.stride = TRACK_STRIDE if stride is None else int(stride)
        self.addrs = np.arange(addr, addr + size, PAGE * self.stride, dtype=np.uint64)
        self.node = self._query()
        self.last_from = np.full(len(self.addrs), -1, np.int32)
        self.last_t = np.full(len(self.addrs), -1e9)
        self.moved = self.ping_pongs = 0

    def _query(self):
        from pagetier.core import mover

        return mover.query_nodes(self.pid, self.addrs)

    def sample(self, t: float) -> float | None:
        """Update from a fresh look; return MB of the buffer on the fast node."""
        np = self.np
        try:
            cur = self._query()
        except (PagetierError, OSError):  # the workload just exited
            return None
        idx = np.nonzero((cur >= 0) & (self.node >= 0) & (cur != self.node))[0]
        back = (cur[idx] == self.last_from[idx]) & (t - self.last_t[idx] <= self.window)
        self.ping_pongs += int(back.sum()) * self.stride
        self.moved += len(idx) * self.stride
        self.last_from[idx] = self.node[idx]
        self.last_t[idx] = t
        self.node = np.where(cur >= 0, cur, self.node)
        return int((cur == FAST).sum()) * self.stride * PAGE / 2**20


class Lines:
    """JSON lines from a pipe read without blocking (select, then os.read)."""

    def __init__(self, fd: int):
        self.fd, self.buf, self.eof = fd, b"", False

    def read(self) -> list[dict]:
        try:
            chunk = os.read(self.fd, 1 << 16)
        except BlockingIOError:
            return []
        if not chunk:
            self.eof = True
        self.buf += chunk
        *lines, self.buf = self.buf.split(b"\n")
        out = []
        for ln in lines:
            try:
                out.append(json.loads(ln))
            except ValueError:
                sys.stderr.write(ln.decode(errors="replace") + "\n")
        return out


def vmstat(key: str) -> int:
    return vmstats((key,))[key]


def vmstats(keys=VMSTAT_KEYS) -> dict[str, int]:
    """Those /proc/vmstat counters (0 for one this kernel lacks)."""
    out = dict.fromkeys(keys, 0)
    for line in Path("/proc/vmstat").read_text().splitlines():
        k, _, v = line.partition(" ")
        if k in out:
            out[k] = int(v)
    return out


def fork_daemon(pid: int, policy: str, spec: Spec,
                options: dict | None = None) -> tuple[int, int]:
    """The pagetier daemon on ``pid`` in a forked child (the modules are imported already: no
    second interpreter start under emulation), with kmod profiler ``options``
    (daemon_profiler_options; None: those of ``pagetier:POLICY`` in the scenario's mode).
    Returns (child pid, read end of its JSON lines)."""
    if options is None:
        options = daemon_profiler_options(f"pagetier:{policy}", spec)
    from pagetier.daemon.loop import Daemon, create_policy, create_profiler
    from pagetier.daemon.numab import NumaBalancing

    name, policy_options = policy_spec(policy)
    policy_options, _ = kmod_knobs(policy_options)  # set by the run (ConfigRun.start_daemon)
    overrides = {"policy": name, "fast_budget": f"{spec.budget_mb}M", "interval": spec.interval_s,
                 "json": True, "profiler": "kmod", "policy_options": policy_options,
                 "profiler_options": options}
    cfg = config_mod.load(None, overrides)  # errors here, in the parent
    config_mod.check_nodes(cfg)
    return fork_run(lambda out: Daemon(cfg, pids=[pid], profiler=create_profiler(cfg),
                                       policy=create_policy(cfg), numab=NumaBalancing(),
                                       out=out))


def fork_run(build) -> tuple[int, int]:
    """Run ``build(out).run()`` (``build`` makes a daemon writing its lines to ``out``) in a
    forked child, which exits with its return code (1 on an exception, whose traceback goes to
    stderr). Returns (child pid, read end of the lines)."""
    r, w = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the guest
        rc = 1
        try:
            os.close(r)
            out = os.fdopen(w, "w")
            rc = build(out).run()
            out.flush()
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(rc)
    os.close(w)
    return child, r


def _set_sysctls(numab: str, demotion: str) -> None:

    if kernel_tiering.NUMAB.exists():
        kernel_tiering.write_sysctl(kernel_tiering.NUMAB, numab)
    if kernel_tiering.DEMOTION.exists():
        kernel_tiering.write_sysctl(kernel_tiering.DEMOTION, demotion)


class ConfigRun:
    """One configuration against a fresh workload, in named steps (run_config calls them in
    order): the manager set up, the workload started and ready, pagetier's daemon forked, the
    fast node cut to the scenario's free memory, the run watched once a second until the
    workload ends, its record completed; :meth:`cleanup` undoes what was set up, whatever
    happened. ``file_dir``: where a file-mapped scenario's file goes (a disk-backed file
    system, see FileSystem)."""

    DAEMON_TOTALS = ("promoted", "demoted", "bytes_moved", "ping_pongs", "failed", "nomem",
                     "busy", "clipped", "deferred")
    DAEMON_KEYS = ("t", "early", "looked", "units", "promoted", "demoted", "fast_used", "cpu_s",
                   "wall_s", "deferred", "clipped", "limit", "rate_pages", "throughput_mb_s",
                   "merge_s", "decide_s", "move_s", "profiler_scan_s", "policy", "errors",
                   "fast_capacity", "fast_room", "wanted_bytes", "modes")

    def __init__(self, name: str, spec: Spec, log=print, file_dir: Path | None = None):
        self.name, self.spec, self.log = name, spec, log
        self.rec: dict = {"scenario": spec.name, "config": name, "runnable": True,
                          "phase_s": spec.phase, "hot_mb": spec.hot_mb, "memory": spec.memory,
                          "notes": []}
        self.file = None
        if spec.memory in FILE_KINDS:
            if file_dir is None:
                raise PagetierError(f"{spec.name}: a file-mapped scenario needs a file system")
            self.file = Path(file_dir) / "hotcold.buf"
        self.manager = None
        self.capacity = FastCapacity(FAST)
        self.proc = self.wl = self.ready = None
        self.daemon_pid = self.daemon_fd = self.dm = None
        self.knobs_before: dict = {}  # pagetier.ko's knobs this run set, as they were
        self.dstats: list[dict] = []
        self.ticks: list[dict] = []
        self.samples: list[dict] = []

    def start_manager(self) -> bool:
        """Sysctls to no migration, and the kernel's or DAMOS's tiering started for those
        configurations; False (the record says why) when it cannot run here."""
        if self.name == "kernel":
            self.manager = kernel_tiering.KernelTiering(FAST, SLOW)
        elif self.name == "damos":
            self.manager = kernel_tiering.DamosTiering(FAST, SLOW)
        if self.manager is not None:
            why = self.manager.probe()
            if why:
                self.rec.update(runnable=False, reason=why)
                self.manager = None
                return False
        _set_sysctls("0", "false")
        if self.manager is not None:
            self.manager.start()
        return True

    def start_workload(self) -> int:
        """hotcold started (it waits for SIGUSR1); its pid once it is ready."""
        from pagetier.workload import binary

        argv = [*self.spec.prefix(), str(binary()), *self.spec.workload_args(self.file)]
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE)
        self.wl = Lines(self.proc.stdout.fileno())
        while self.ready is None and not self.wl.eof:
            select.select([self.wl.fd], [], [], 5)
            self.ready = next((e for e in self.wl.read() if e.get("event") == "ready"), None)
        if self.ready is None:
            raise PagetierError(f"{self.name}: the workload exited before it was ready ({argv})")
        return self.ready["pid"]

    def start_daemon(self, pid: int) -> None:
        """For a pagetier configuration, the daemon forked on ``pid``, once it reported its
        first interval."""
        if not self.name.startswith("pagetier:"):
            return
        policy, _ = config_mode(self.name, self.spec)
        _, knobs = kmod_knobs(policy_spec(policy)[1])
        if knobs:  # this configuration's pagetier.ko knobs, put back by cleanup()
            self.knobs_before = set_kmod_knobs(knobs)
        self.daemon_pid, self.daemon_fd = fork_daemon(
            pid, policy, self.spec, daemon_profiler_options(self.name, self.spec))
        self.dm = Lines(self.daemon_fd)
        deadline = time.monotonic() + 300
        while not self.dstats and not self.dm.eof and time.monotonic() < deadline:
            select.select([self.daemon_fd], [], [], 5)
            self.dstats += [e for e in self.dm.read() if "interval" in e]
        if not self.dstats:
            raise PagetierError(f"{self.name}: the daemon did not start (see its output above)")

    def cut_capacity(self) -> int:
        """The fast node's free memory cut to the scenario's, plus the promotion watermark;
        the free memory reached (bytes)."""
        # read once: a watermark boost moves it
        promo = config_mod.zone_watermark(FAST, "promo", page_size=PAGE)
        reached = self.capacity.set(self.spec.free_mb() * 2**20 + promo)
        self.rec["fast_capacity_mb"] = round((reached - promo) / 2**20, 1)
        return reached

    def mgr_cpu(self):
        """CPU seconds of whatever decides and moves (None: not measurable)."""
        if self.daemon_pid is not None:
            return kernel_tiering.thread_cpu_s(self.daemon_pid)
        return self.manager.cpu_s() if self.manager is not None else None

    def prof_cpu(self):
        """pagetier.ko's scan time so far, from the daemon's last line (None: no daemon)."""
        if self.daemon_pid is None:
            return None
        return self.dstats[-1].get("profiler_scan_s", 0.0) if self.dstats else 0.0

    def watch(self, pid: int) -> None:
        """SIGUSR1 to the workload, then its ticks and the daemon's lines as they come and the
        bench's own look once a second, until the workload ends."""
        spec, name, wl = self.spec, self.name, self.wl
        tracker = PageTracker(pid, self.ready["addr"], self.ready["size"])
        vm0 = vmstats()
        self.vm0, mig0 = vm0, vm0["pgmigrate_success"]
        cpu0, prof0 = self.mgr_cpu(), self.prof_cpu()
        t0 = time.monotonic()
        self.proc.send_signal(signal.SIGUSR1)
        next_sample = t0 + 1.0
        while not wl.eof:
            fds = [wl.fd] + ([self.daemon_fd] if self.dm is not None and not self.dm.eof else [])
            ready_fds, _, _ = select.select(fds, [], [], max(0.0, next_sample - time.monotonic()))
            if wl.fd in ready_fds:
                for e in wl.read():
                    if e.get("event") == "tick":
                        self.ticks.append(e)
                    elif e.get("event") == "done":
                        self.rec["done"] = e
            if self.dm is not None and self.daemon_fd in ready_fds:
                self.dstats += [e for e in self.dm.read() if "interval" in e]
            now = time.monotonic()
            if now >= next_sample and "done" not in self.rec and now - t0 <= spec.seconds + 0.5:
                t = now - t0
                fast_mb = tracker.sample(t)
                next_sample += 1.0
                if fast_mb is None:  # the workload is exiting
                    continue
                c, p = self.mgr_cpu(), self.prof_cpu()
                self.samples.append({
                    "t": round(t, 2), "fast_mb": round(fast_mb, 1), "moved_pages": tracker.moved,
                    "ping_pongs": tracker.ping_pongs,
                    "pgmigrate": vmstat("pgmigrate_success") - mig0,
                    "mgr_cpu_s": None if c is None else round(c - cpu0, 3),
                    "prof_cpu_s": None if p is None else round(p - prof0, 3)})
                if self.ticks:
                    migrated = self.samples[-1]["pgmigrate"] * PAGE / 2**20
                    self.log(f"[{spec.name} {name}] t={t:4.0f}s hot set on fast "
                             f"{max(self.ticks[-1]['fast_fraction'], 0) * 100:5.1f}%, workload "
                             f"on fast {fast_mb:6.1f} MB, migrated {migrated:6.1f} MB, "
                             f"pp {tracker.ping_pongs}")

    def finish(self) -> dict:
        """The record completed once the workload has exited: vmstat growth, the memory check
        (and a file-mapped scenario's file read back), the daemon's totals and lines."""
        rec = self.rec
        rc = self.proc.wait()
        vm1 = vmstats()
        rec["vmstat"] = {k: vm1[k] - self.vm0[k] for k in self.vm0}
        rec["memory_ok"] = rc == 0 and rec.get("done", {}).get("pages_corrupt", 1) == 0
        if self.file is not None:
            from pagetier.workload import check_file

            checked, bad = check_file(self.file, self.ready["size"])
            rec["file_check"] = {"pages_checked": checked, "pages_corrupt": len(bad)}
            rec["memory_ok"] = rec["memory_ok"] and not bad
        rec.update(ticks=self.ticks, samples=self.samples)
        if self.daemon_pid is not None:
            rec["daemon_totals"] = {k: sum(s.get(k, 0) for s in self.dstats)
                                    for k in self.DAEMON_TOTALS}
            errors: dict[str, int] = {}
            for s in self.dstats:
                for k, v in (s.get("errors") or {}).items():
                    errors[k] = errors.get(k, 0) + v
            rec["daemon_totals"]["errors"] = errors
            rec["daemon_stats"] = [{k: s.get(k) for k in self.DAEMON_KEYS} for s in self.dstats]
        if isinstance(self.manager, kernel_tiering.DamosTiering):
            rec["damos_applied_bytes"] = self.manager.applied_bytes()
        rec["notes"] = _notes(self.name)
        return rec

    def cleanup(self) -> None:
        """The workload killed if it still runs, the daemon reaped, the manager stopped, the
        fast node's reservation released, the sysctls back to no migration; the file removed."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if self.daemon_pid is not None:
            _reap(self.daemon_pid)
            os.close(self.daemon_fd)
        if self.knobs_before:
            set_kmod_knobs(self.knobs_before)
            self.knobs_before = {}
        if self.manager is not None:
            self.manager.stop()
        self.capacity.release()
        _set_sysctls("0", "false")
        if self.file is not None:
            self.file.unlink(missing_ok=True)


class ProgramRun(ConfigRun):
    """A third-party program (Spec.program) in the place of hotcold. It knows no SIGUSR1 and
    says nothing of a hot part, so:

    - its memory is first touched on the slow node under the default policy (which the
      kernel's tiering may act on, unlike a numactl binding): the fast node is filled (2 MiB
      hugetlb pages) before the program starts, its allocations fall back to the slow node,
      and once it holds its memory the fast node is cut to the scenario's free memory as for
      hotcold (the program runs from its start: the same for every configuration);
    - once a second, its memory's share on the fast node from /proc/PID/numa_maps (the
      anonymous mappings' N0=/N1= page counts), written as the ticks' ``fast_fraction``: its
      whole memory is the "hot part" (it fits in the budget);
    - ``seconds`` after the run's start it is ended with SIGINT, and its own throughput
      figure over the run read from its output (``program_rate``)."""

    READY_S = 600.0  # its memory allocated within this (first touch under emulation is slow)

    def start_workload(self) -> int:
        self.capacity.set(0)  # the fast node as full as the kernel lets it be
        argv = self.spec.program_argv()
        if not shutil.which(argv[0]):
            raise PagetierError(f"{argv[0]} is not installed (Debian: apt install {argv[0]})")
        # in a writable directory: stress-ng makes its temporary files in its working one
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     cwd=tempfile.gettempdir())
        want = self.spec.size_mb * 2**20 * 0.9
        deadline = time.monotonic() + self.READY_S
        while time.monotonic() < deadline and self.proc.poll() is None:
            pid, rss = max(((p, _rss(p)) for p in _tree(self.proc.pid)), key=lambda x: x[1])
            if rss >= want:
                self.ready = {"pid": pid, "rss": rss}
                return pid
            time.sleep(0.5)
        if self.proc.poll() is not None:
            out = self.proc.stdout.read().decode(errors="replace").strip()
            raise PagetierError(f"{self.name}: {argv[0]} exited ({self.proc.returncode}) before "
                                f"it held its memory: {out[-300:]}")
        raise PagetierError(f"{self.name}: {argv[0]} did not allocate its memory "
                            f"({self.spec.size_mb} MiB) within {self.READY_S:.0f} s")

    def cut_capacity(self) -> int:
        """As for hotcold, and the run starts as the cut begins: until then the fast node was
        full, so nothing could move the program's memory to it; from then on the kernel or
        the daemon may (the daemon is already running: the program cannot wait for it)."""
        # the baselines before the cut: the fast node frees over seconds as the hugetlb pages
        # go back, and moves start with the first of them
        self.t_go, self.vm_go = time.monotonic(), vmstats()
        self.cpu_go, self.prof_go = self.mgr_cpu(), self.prof_cpu()
        return super().cut_capacity()

    def watch(self, pid: int) -> None:
        """Once a second until the program ends: its share on the fast node, vmstat, CPU."""
        spec, name = self.spec, self.name
        self.vm0, mig0 = self.vm_go, self.vm_go["pgmigrate_success"]
        cpu0, prof0 = self.cpu_go, self.prof_go
        t0 = self.t_go
        fd = self.proc.stdout.fileno()
        os.set_blocking(fd, False)
        try:  # what it printed before the run (sysbench's reports of those seconds)
            self.before = os.read(fd, 1 << 20) or b""
        except BlockingIOError:
            self.before = b""
        self.output = b""
        stopped = None
        while self.proc.poll() is None:
            if stopped is None and time.monotonic() - t0 >= spec.seconds:
                self.proc.send_signal(signal.SIGINT)
                stopped = time.monotonic()
            elif stopped is not None and time.monotonic() - stopped > 60:
                self.proc.kill()
            fds = [self.proc.stdout.fileno()] + ([self.daemon_fd] if self.dm is not None
                                                 and not self.dm.eof else [])
            ready_fds, _, _ = select.select(fds, [], [], 1.0)
            if fd in ready_fds:
                try:
                    self.output += os.read(fd, 1 << 16)
                except BlockingIOError:
                    pass
            if self.dm is not None and self.daemon_fd in ready_fds:
                self.dstats += [e for e in self.dm.read() if "interval" in e]
            t = time.monotonic() - t0
            if stopped is not None or (self.ticks and t - self.ticks[-1]["t"] < 1.0):
                continue
            fast, slow = numa_maps_pages(pid)
            if fast + slow == 0:
                continue
            share = fast / (fast + slow)
            self.ticks.append({"t": round(t, 2), "phase": 0, "fast_fraction": round(share, 4),
                               "access_fast_fraction": -1, "accesses_per_s": None})
            c, p = self.mgr_cpu(), self.prof_cpu()
            self.samples.append({
                "t": round(t, 2), "fast_mb": round(fast * PAGE / 2**20, 1), "moved_pages": 0,
                "ping_pongs": None, "pgmigrate": vmstat("pgmigrate_success") - mig0,
                "mgr_cpu_s": None if c is None else round(c - cpu0, 3),
                "prof_cpu_s": None if p is None else round(p - prof0, 3)})
            self.log(f"[{spec.name} {name}] t={t:4.0f}s program on fast {share * 100:5.1f}%, "
                     f"migrated {self.samples[-1]['pgmigrate'] * PAGE / 2**20:6.1f} MB")
        os.set_blocking(fd, True)
        self.output += self.proc.stdout.read()

    def finish(self) -> dict:
        rec = super().finish()
        text = self.output.decode(errors="replace")
        rate, unit = program_rate(self.spec.program, text)
        # no memory check of its own; it ran until the bench's SIGINT or failed before
        rec.update(memory_ok=None, program_rate=rate, program_unit=unit,
                   program_exit=self.proc.returncode, program_output=text[-2000:])
        if rate is None:
            self.log(f"[{self.spec.name} {self.name}] exit {self.proc.returncode}, no "
                     f"throughput figure: {text[-500:]}")
        return rec


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants (stress-ng's workers are its children)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                todo += [int(c) for c in (task / "children").read_text().split()]
            except (OSError, ValueError):
                continue
    return out


def _rss(pid: int) -> int:
    """Resident bytes of ``pid`` (0 when it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def numa_maps_pages(pid: int) -> tuple[int, int]:
    """(pages on the fast node, pages on the slow node) of ``pid``'s anonymous mappings, from
    /proc/PID/numa_maps ((0, 0) when it is gone). N<node>= counts base pages."""
    fast = slow = 0
    try:
        text = Path(f"/proc/{pid}/numa_maps").read_text()
    except OSError:
        return 0, 0
    for line in text.splitlines():
        if " anon=" not in line:
            continue
        for field in line.split():
            if field.startswith(f"N{FAST}="):
                fast += int(field[len(f"N{FAST}="):])
            elif field.startswith(f"N{SLOW}="):
                slow += int(field[len(f"N{SLOW}="):])
    return fast, slow


def program_rate(program: str, text: str) -> tuple[float | None, str]:
    """A program's own throughput figure from its output: stress-ng's vm bogo ops/s (real
    time), sysbench memory's MiB/sec; (None, unit) when it printed none."""
    import re

    if program.startswith("stress-ng"):
        m = re.search(r"\]\s+vm\s+\d+\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+([\d.]+)", text)
        return (float(m.group(1)) if m else None), "bogo ops/s"
    reports = [float(x) for x in re.findall(r"\[\s*\d+s\s*\]\s+([\d.]+) MiB/sec", text)]
    if reports:  # the once-a-second reports: their mean
        return sum(reports) / len(reports), "MiB/s"
    m = re.search(r"\(([\d.]+) MiB/sec\)", text)
    return (float(m.group(1)) if m else None), "MiB/s"


def run_config(name: str, spec: Spec, log=print, file_dir: Path | None = None) -> dict:
    """One configuration against a fresh workload; its record (see live_table)."""
    run = (ProgramRun if spec.program else ConfigRun)(name, spec, log, file_dir)
    try:
        if not run.start_manager():
            return run.rec
        pid = run.start_workload()
        run.start_daemon(pid)
        reached = run.cut_capacity()
        log(f"[{spec.name} {name}] workload pid {pid}: {spec.describe()}; first touched on node "
            f"{SLOW}; fast node free {reached / 2**20:.0f} MiB ({spec.free_mb()} MiB + the "
            f"promotion watermark); go")
        run.watch(pid)
        return run.finish()
    finally:
        run.cleanup()


def _reap(pid: int, timeout: float = 60) -> None:
    """Wait for the daemon (it ends when its target has); kill it if it hangs."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done:
            return
        time.sleep(0.2)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)


def _notes(name: str) -> list[str]:
    if name == "kernel":
        return ["mgr s: kswapd0 (demotion); NUMA scanning and promotion run in the workload's "
                "own task, visible only in its accesses/s"]
    if name == "damos":
        return ["mgr s: both kdamonds (monitoring and migration)"]
    if name.startswith("pagetier:"):
        return ["mgr s: the daemon process; prof s: pagetier.ko scan time (its hinting faults "
                "run in the workload's task)"]
    return []


def guest_main(names: list[str], specs: list[Spec], out_path: Path, log=print,
               repeat: int = 1) -> int:
    """Runs inside the VM: every configuration of every scenario in turn, ``repeat`` times (the
    configurations take turns: kernel, pagetier, ..., then kernel again, so a drift of the host
    touches them alike); the records as JSON to ``out_path`` (rewritten after each run, so a
    run cut short keeps what it measured)."""
    from pagetier.profiler import kmod

    saved = {p: kernel_tiering.read_sysctl(p)
             for p in (kernel_tiering.NUMAB, kernel_tiering.DEMOTION) if p.exists()}
    tiers = kernel_tiering.memory_tiers()
    log("memory tiers: " + (", ".join(f"memory_tier{t} = nodes {nl}" for t, nl in tiers.items())
                            or "none"))
    doc = {"kernel": os.uname().release, "memory_tiers": tiers, "configs": names,
           "repeat": repeat, "scenarios": []}
    loaded = False
    fs, file_dir = None, None
    try:
        if any(n.startswith("pagetier:") for n in names):
            kmod.load_module()
            loaded = True
            check_kmod_knobs(names)  # a knob the module has not: said before any run
        file_mb = max((s.size_mb for s in specs if s.memory in FILE_KINDS), default=0)
        if file_mb:  # room for the file and ext4's own blocks
            fs = FileSystem(file_mb + 64 + file_mb // 8)
            file_dir = fs.__enter__()
        for spec in specs:
            records = []
            doc["scenarios"].append({"spec": asdict(spec), "records": records})
            for run in range(repeat):
                for name in names:
                    t = time.monotonic()
                    try:
                        rec = run_config(name, spec, log=log, file_dir=file_dir)
                    except PagetierError as e:
                        rec = {"scenario": spec.name, "config": name, "runnable": False,
                               "reason": f"failed: {e}"}
                    rec["run"] = run
                    rec["wall_s"] = round(time.monotonic() - t, 1)
                    which = f" run {run + 1}/{repeat}" if repeat > 1 else ""
                    log(f"[{spec.name} {name}{which}] " + ("done" if rec["runnable"] else
                                                           f"not run: {rec['reason']}")
                        + f" ({rec['wall_s']:.0f} s)")
                    records.append(rec)
                    out_path.write_text(json.dumps(doc))
    finally:
        for p, v in saved.items():
            kernel_tiering.write_sysctl(p, v)
        if loaded:
            kmod.unload_module()
        if fs is not None:
            fs.__exit__(None, None, None)
    out_path.write_text(json.dumps(doc))
    return 0


# ------------------------------------------------------------------ host side
def results(doc: dict) -> list[dict]:
    """Every scenario's rows, one per configuration (the medians of its runs when repeated:
    live_table.combine), each with its ratios to kernel tiering in that scenario."""
    rows = []
    for sc in doc["scenarios"]:
        runs: dict[str, list[dict]] = {}
        errors: dict[str, dict[str, int]] = {}
        for r in sc["records"]:
            row = live_table.summarize(r)
            row["scenario"] = sc["spec"]["name"]
            runs.setdefault(row["config"], []).append(row)
            errs = errors.setdefault(row["config"], {})
            for k, v in ((r.get("daemon_totals") or {}).get("errors") or {}).items():
                errs[k] = errs.get(k, 0) + v
        combined = [live_table.combine(rs) for rs in runs.values()]
        for row in combined:
            row["daemon_errors"] = errors.get(row["config"], {})
        rows += live_table.add_ratios(combined)
    return rows


def format_kinds(rows: list[dict], doc: dict) -> str:
    """Each configuration's figures in a scenario's shmem and file forms beside its anonymous
    form (the same scenario on private anonymous memory, when it ran): t95 and held, and the
    ratio of t95 and MB moved to the anonymous run's; '' when no scenario has another kind."""
    kind_of = {sc["spec"]["name"]: sc["spec"].get("memory", "anon") for sc in doc["scenarios"]}
    by = {(r.get("scenario"), r["config"]): r for r in rows if r["runnable"]}
    out = []
    for (scen, config), r in by.items():
        kind = kind_of.get(scen, "anon")
        if kind == "anon":
            continue
        base = scen[:-len(kind) - 1] if scen.endswith("-" + kind) else None
        a = by.get((base, config), {})
        t95_x = live_table.ratio(r["t95"], a.get("t95"))
        moved_x = live_table.ratio(r["moved_mb"], a.get("moved_mb"))
        held, held_a = r["held"], a.get("held")
        out.append(f"{scen:<16} {config:<20} {_fmt(r['t95'], '.1f'):>6} "
                   f"{_fmt(a.get('t95'), '.1f'):>6} {_fmt(t95_x, '.2f'):>6} "
                   f"{_fmt(None if held is None else held * 100, '.1f'):>6} "
                   f"{_fmt(None if held_a is None else held_a * 100, '.1f'):>6} "
                   f"{r['moved_mb']:>8.1f} {_fmt(moved_x, '.2f'):>6} {_errors(r)}")
    if not out:
        return ""
    head = (f"{'memory kind':<16} {'config':<20} {'t95 s':>6} {'anon':>6} {'x anon':>6} "
            f"{'held %':>6} {'anon':>6} {'MB moved':>8} {'x anon':>6} daemon per-page errors")
    return "\n".join(["the shmem and file forms beside the same scenario on anonymous memory "
                      "(anon: its figure there; x anon: ratio to it):", head, *out])


def _fmt(x, fmt: str) -> str:
    return "--" if x is None else format(x, fmt)


def _errors(row: dict) -> str:
    """The daemon's per-page move_pages errors, by errno name, summed over the runs ('' for
    the other configurations)."""
    errs = (row.get("daemon_errors") or {})
    return ",".join(f"{k}:{v}" for k, v in sorted(errs.items())) or ""


def report(doc: dict, command_line: str) -> str:
    rows = results(doc)
    tiers = ", ".join(f"memory_tier{t}: nodes {nl}" for t, nl in doc["memory_tiers"].items())
    head = [
        f"$ {command_line}",
        f"kernel {doc['kernel']}; memory tiers: {tiers or 'none'}",
        "scenarios (every page first touched on the slow node; each configuration gets the fast "
        "node cut to the same free memory: the budget, or less where 'node free' says so, plus "
        "the promotion watermark):",
    ]
    head += [f"  {sc['spec']['name']:<16} {Spec(**sc['spec']).describe()}" for sc in doc["scenarios"]]
    head += [
        "t95 s: s from a phase's start until >= 95% of the hot set is on the fast node (mean of "
        "the phases that got there; reach: how many did); held %: mean share of the hot set on "
        "the fast node over the last third of each phase; MB moved: pgmigrate_success of the "
        f"guest during the run; x hot: MB moved / hot set MB; pp: workload pages moved back "
        f"within {PING_PONG_S:.0f} s (4 KiB pages, from one in {TRACK_STRIDE}); mgr s: CPU s of "
        "the mover; x kern: ratio to kernel tiering in the same scenario; -kern: held minus "
        "kernel's, in points; acc/s x: "
        "workload speed vs kernel tiering",
    ]
    if doc.get("repeat", 1) > 1:
        head.append(f"each configuration ran {doc['repeat']} times, taking turns; every figure is "
                    "the median of its runs (t95: a run that never got there counts as the "
                    "slowest; reach: summed over the runs); ratios are of the medians; each "
                    "run's own figures are listed below the tables")
    head += [
        "",
        live_table.format_table(rows),
        "",
    ]
    summary = live_table.family_summary(rows)
    if summary:
        head += [summary, ""]
    head.append(live_table.format_series(rows))
    # the sections that have something to say, each after a blank line
    for section in (live_table.format_phases, live_table.format_runs, live_table.format_moves,
                    live_table.format_splits, lambda rs: format_kinds(rs, doc),
                    live_table.format_programs, live_table.format_limits):
        text = section(rows)
        if text:
            head += ["", text]
    for spec in (Spec(**sc["spec"]) for sc in doc["scenarios"]):
        if spec.preferred_slow:
            head.append(f"{spec.name}: the workload runs under numactl --preferred={SLOW}; the "
                        "kernel's NUMA balancing takes no hinting faults for memory under such "
                        "a policy, so kernel tiering cannot promote it (its row shows that): "
                        "pagetier's row is pagetier alone")
    for r in rows:
        if r["runnable"] and r.get("memory_ok") is False:
            head.append(f"WARNING: {r['scenario']} {r['config']}: the workload's memory check failed")
    notes = sorted({n for r in rows if r["runnable"] for n in r.get("notes", [])})
    if notes:
        head += [""] + [f"note: {n}" for n in notes]
    if doc.get("vm_seconds"):
        head.append(f"VM run: {doc['vm_seconds']:.0f} s from boot to results")
    for rep in doc.get("kernel_reports", []):
        head.append(f"KERNEL REPORT during the run: {rep.strip()}")
    return "\n".join(head)


def run_in_vm(names, specs: list[Spec], kernel: str, quick: bool = False,
              seconds: int | None = None, mode: str = "fault", echo: bool = True,
              interval: float | None = None, repeat: int = 1,
              profiler_options: dict | None = None) -> dict:
    """Boots the HMAT VM once and runs every scenario in it, each configuration ``repeat``
    times (``echo``: the guest's progress to stdout as it comes)."""
    from pagetier.workload import binary

    binary()
    cmd = (f"pagetier bench live --in-guest --configs {shlex.quote(','.join(names))} "
           f"--scenarios {shlex.quote(','.join(s.name for s in specs))} --mode {mode} "
           + ("--quick " if quick else "") + (f"--seconds {seconds} " if seconds else "")
           + (f"--interval {interval:g} " if interval is not None else "")
           + (f"--repeat {repeat} " if repeat > 1 else "")
           + "".join(f"-O {shlex.quote(f'{k}={v}')} " for k, v in (profiler_options or {}).items())
           + f"-o \"$PAGETIER_VM_OUT/{RESULT_NAME}\"")
    t0 = time.monotonic()
    budget = sum(len(names) * repeat * (s.seconds + 120) for s in specs)
    res = test_vm().run(cmd, kernel=kernel, fast="1G", slow="1G", hmat=True, echo=echo,
                 timeout=900 + budget)
    result = res.outdir / RESULT_NAME
    if res.returncode != 0 or not result.exists():
        res.check()
        raise PagetierError(f"bench live: the guest wrote no results ({result})")
    doc = json.loads(result.read_text())
    # A kernel report during a run is a result too (e.g. a kdamond soft lockup under emulation):
    # shown with the table, and the command exits non-zero.
    doc["kernel_reports"] = res.reports
    doc["vm_seconds"] = round(time.monotonic() - t0, 1)
    return doc
