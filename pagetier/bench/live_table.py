"""The figures of ``pagetier bench live``: one run's raw record turned into metrics, ratios
against kernel tiering in the same scenario, and the side-by-side tables. Pure functions
(unit-tested on the host).

A run's record (what the guest side writes) holds:

- ``ticks``: the workload's own lines, once a tick (bench live asks for ``TICK_MS``, live.py):
  ``t`` (its clock), ``phase``,
  ``fast_fraction`` (share of the hot part's pages on the fast node; -1 when no page's node was
  known), ``access_fast_fraction`` (share of that tick's accesses to the hot part served by the
  fast node), ``accesses_per_s``;
- ``samples``: the bench's own look once a second, cumulative since the workload started:
  ``t``, ``fast_mb`` (workload pages on the fast node), ``moved_pages`` and ``ping_pongs`` (of
  the workload's pages, seen by comparing each page's node between samples), ``pgmigrate``
  (/proc/vmstat ``pgmigrate_success`` since the start: every page migrated in the guest),
  ``mgr_cpu_s`` and ``prof_cpu_s`` (None where not measurable);
- ``vmstat``: /proc/vmstat counters' growth from the start to the workload's end
  (``pgmigrate_success``, ``pgpromote_success``, ``pgdemote_kswapd``, ``numa_hint_faults``, ...);
- ``hot_mb``: the hot part's size;
- ``phase_s``: seconds per phase of the workload (its hot part moves to the next window then;
  0: it never moves).

The metrics (per configuration and scenario):

- ``t95``: seconds from a phase's start (when the workload moved its hot part) until at least 95% of the hot part's pages are on the fast
  node (the workload's own move_pages look, once a tick), the mean over the phases that got
  there; ``reached``: how many phases did;
- ``held``: the mean share of the hot part on the fast node over the last third of each phase
  (of the whole run when the hot part does not move): whether the placement holds;
- ``moved_mb``: MB migrated in the guest during the run (``pgmigrate_success`` from the start
  to the workload's end), ``pp``:
  ping-pongs (workload pages moved back to the node they left within the bench's window);
- ratios to kernel tiering: ``t95 / t95_kernel``, ``moved / moved_kernel`` and
  ``held - held_kernel`` (percentage points).
"""
from __future__ import annotations

import math
import statistics

HOT_THRESHOLD = 0.95  # the hot set "reached" the fast node when this share of its pages is there
HELD_PART = 1 / 3  # held: the mean over the last third of each phase
PAGE = 4096
SAME_TICK_S = 0.05  # t95s this close are the same tick of the workload's (family_summary)
BASELINE = "kernel"


def _mean(xs):
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def _frac(tick: dict, key: str):
    """A tick's fraction, None when the workload could not tell (it writes -1 then)."""
    v = tick.get(key)
    return None if v is None or v < 0 else v


def _phases(ticks: list[dict], phase_s: float) -> list[tuple[int, float, float]]:
    """(phase, start, end) of each phase that started during the run. The workload moves its hot
    part right after the first tick at or past a phase boundary (that tick still reports the old
    phase), so a phase starts at the previous phase's last tick; the last phase ends with the
    last tick."""
    if not ticks:
        return []
    last_t = ticks[-1]["t"]
    if not phase_s:
        return [(0, 0.0, last_t)]
    ends: dict[int, float] = {}
    for t in ticks:
        ends[t["phase"]] = max(ends.get(t["phase"], 0.0), t["t"])
    out = []
    for k in range(max(ends) + 1):
        start = ends.get(k - 1, k * phase_s) if k else 0.0
        if start >= last_t:
            break
        out.append((k, start, ends.get(k, start + phase_s)))
    return out


def time_to_hot(ticks: list[dict], phase_s: float, threshold: float = HOT_THRESHOLD,
                key: str = "fast_fraction"):
    """Per phase that started during the run: seconds from its start to the first tick where at
    least ``threshold`` of the hot part was on the fast node (``key``: or of the accesses went
    there); None: not within the phase."""
    out = []
    for k, start, _ in _phases(ticks, phase_s):
        hit = next((t["t"] for t in ticks if t["phase"] == k
                    and (_frac(t, key) or 0.0) >= threshold), None)
        out.append(None if hit is None else round(hit - start, 2))
    return out


def held_share(ticks: list[dict], phase_s: float, part: float = HELD_PART,
               key: str = "fast_fraction"):
    """Mean share of the hot part on the fast node over the last ``part`` of each phase (the
    phases' means averaged; a phase with no tick there is left out)."""
    per_phase = []
    for k, start, end in _phases(ticks, phase_s):
        since = end - part * (end - start)
        per_phase.append(_mean([_frac(t, key) for t in ticks
                                if t["phase"] == k and t["t"] >= since]))
    return _mean(per_phase)


def read_interval(rec: dict) -> float | None:
    """The daemon's measured interval in a pagetier run: the median time between its reads
    (longer than --interval: reads wait for whole scan periods); None for a baseline."""
    ts = [s["t"] for s in rec.get("daemon_stats") or () if s.get("t") is not None]
    gaps = sorted(b - a for a, b in zip(ts, ts[1:]) if b > a)
    return round(gaps[len(gaps) // 2], 3) if gaps else None


def move_figures(rec: dict) -> tuple[float | None, float | None]:
    """(MB the daemon moved, seconds it spent moving) over a pagetier run, from its per-interval
    stats (promoted and demoted 4 KiB pages, move_s: the wall time of that interval's
    move_pages calls); (None, None) for a baseline."""
    if not rec.get("daemon_stats"):
        return None, None
    stats = [s for s in rec["daemon_stats"] if s.get("promoted") or s.get("demoted")]
    pages = sum((s.get("promoted") or 0) + (s.get("demoted") or 0) for s in stats)
    return pages * PAGE / 2**20, sum(s.get("move_s") or 0.0 for s in stats)


def summarize(rec: dict) -> dict:
    """The metrics of one configuration's run (a not-runnable one keeps its reason)."""
    out = {"scenario": rec.get("scenario"), "config": rec["config"],
           "runnable": rec.get("runnable", True), "reason": rec.get("reason")}
    if not out["runnable"]:
        return out
    ticks, samples = rec.get("ticks", []), rec.get("samples", [])
    phase_s = rec.get("phase_s", 0)
    t95 = time_to_hot(ticks, phase_s)
    reached = [h for h in t95 if h is not None]
    last = samples[-1] if samples else {}
    interval = read_interval(rec)
    move_mb, move_s = move_figures(rec)
    out.update({
        "seconds": ticks[-1]["t"] if ticks else 0.0,
        "hot_mb": rec.get("hot_mb"),
        "t95_phases": t95,
        "interval_s": interval,
        # the fuller-node goal counts intervals: t95 in the daemon's measured intervals
        "t95_intervals": None if interval is None else [
            None if t is None else round(t / interval, 1) for t in t95],
        "t95": _mean(reached),
        "reached": f"{len(reached)}/{len(t95)}",
        "held": held_share(ticks, phase_s),
        "hot_share_series": [[t["t"], _frac(t, "fast_fraction")] for t in ticks],
        "fast_access": _mean([_frac(t, "access_fast_fraction") for t in ticks]),
        "accesses_per_s": _mean([t["accesses_per_s"] for t in ticks]),
        # the counter at the workload's end: a mover's last batch may land after the last sample
        "moved_mb": rec.get("vmstat", {}).get("pgmigrate_success",
                                              last.get("pgmigrate", 0)) * PAGE / 2**20,
        "workload_moved_mb": last.get("moved_pages", 0) * PAGE / 2**20,
        "ping_pongs": last.get("ping_pongs", 0),
        "peak_fast_mb": max((s["fast_mb"] for s in samples), default=0.0),
        "mgr_cpu_s": last.get("mgr_cpu_s"),
        "prof_cpu_s": last.get("prof_cpu_s"),
        # the daemon's own moves: MB and the seconds its move_pages calls took (the page copies
        # in the kernel, most of it), and their ratio
        "move_mb": move_mb,
        "move_s": move_s,
        "move_mb_s": ratio(move_mb, move_s),
        "fast_capacity_mb": rec.get("fast_capacity_mb"),
        "vmstat": rec.get("vmstat", {}),
        "memory_ok": rec.get("memory_ok"),
        "notes": rec.get("notes", []),
        # the daemon's exchanges: intervals that wanted moves, by the limit that stopped them
        # there, and the MB they wanted (None: a baseline, or stats without the figures)
        "limits": _limit_counts(rec.get("daemon_stats") or ()),
        "wanted_mb": _wanted_mb(rec.get("daemon_stats") or ()),
        # a third-party program's own throughput figure (live.ProgramRun; None: hotcold)
        "program_rate": rec.get("program_rate"),
        "program_unit": rec.get("program_unit"),
    })
    return out


def _limit_counts(stats) -> dict[str, int] | None:
    out: dict[str, int] = {}
    for st in stats:
        if st.get("wanted_bytes"):
            out[st.get("limit")] = out.get(st.get("limit"), 0) + 1
    return out or None


def _wanted_mb(stats) -> float | None:
    if not any("wanted_bytes" in st for st in stats):
        return None
    return sum(st.get("wanted_bytes") or 0 for st in stats) / 2**20


# the figures a row of repeated runs gives as the median of its runs (live.py --repeat)
MEDIAN_KEYS = ("seconds", "interval_s", "held", "fast_access", "accesses_per_s", "moved_mb",
               "workload_moved_mb", "ping_pongs", "peak_fast_mb", "mgr_cpu_s", "prof_cpu_s",
               "fast_capacity_mb", "move_mb", "move_s", "move_mb_s", "program_rate")
SPREAD_KEYS = ("t95", "held", "moved_mb", "ping_pongs")  # listed per run under the tables


def median(xs, none_last: bool = False):
    """The median (the mean of the middle two of an even count). ``none_last``: None counts as
    larger than any value (a run that never got there is the slowest; the median is None when
    it falls among them); otherwise Nones are left out (None if nothing is left)."""
    if none_last:
        m = statistics.median([math.inf if x is None else x for x in xs]) if xs else math.inf
        return None if math.isinf(m) else m
    vals = [x for x in xs if x is not None]
    return statistics.median(vals) if vals else None


def combine(runs: list[dict]) -> dict:
    """One row from the rows of repeated runs of a configuration in a scenario: each figure
    the median of the runs' (t95, overall and per phase, counting a run that never got there
    as the slowest); ``reached`` summed over the runs; the hot-share series of all runs
    together (so the table by second shows their mean); vmstat summed. ``runs``: how many ran,
    ``per_run``: their own t95, held, MB moved and ping-pongs; ``failed_runs``: the reasons of
    those that could not run. A single run's row is returned as it is."""
    if len(runs) == 1:
        return runs[0]
    ok = [r for r in runs if r["runnable"]]
    if not ok:
        return runs[0]
    out = dict(ok[0])
    for key in MEDIAN_KEYS:
        out[key] = median([r.get(key) for r in ok])
    out["t95"] = median([r["t95"] for r in ok], none_last=True)
    for key in ("t95_phases", "t95_intervals"):
        lists = [r.get(key) for r in ok]
        if all(lists) and len({len(x) for x in lists}) == 1:
            out[key] = [median(col, none_last=True) for col in zip(*lists)]
        else:
            out[key] = None if key == "t95_intervals" else []
    got = [r["reached"].split("/") for r in ok]
    out["reached"] = f"{sum(int(a) for a, _ in got)}/{sum(int(b) for _, b in got)}"
    out["hot_share_series"] = [p for r in ok for p in r["hot_share_series"]]
    vm: dict = {}
    for r in ok:
        for k, v in (r.get("vmstat") or {}).items():
            vm[k] = vm.get(k, 0) + v
    out["vmstat"] = vm
    checks = [r.get("memory_ok") for r in ok if r.get("memory_ok") is not None]
    out["memory_ok"] = all(checks) if checks else None
    out["notes"] = sorted({n for r in ok for n in r.get("notes", [])})
    out["runs"] = len(ok)
    out["per_run"] = [{k: r.get(k) for k in SPREAD_KEYS + ("move_mb_s",)} for r in ok]
    out["failed_runs"] = [r.get("reason") for r in runs if not r["runnable"]]
    return out


def ratio(x, base):
    """x / base, or None when either is missing or base is 0."""
    if x is None or base is None or base == 0:
        return None
    return x / base


def diff(x, base):
    return None if x is None or base is None else x - base


def add_ratios(rows: list[dict], baseline: str = BASELINE) -> list[dict]:
    """Each runnable row against the baseline row of its scenario: t95 and MB moved as ratios,
    held as a difference, accesses/s as a ratio; and MB moved per MB of the hot set."""
    bases = {r.get("scenario"): r for r in rows if r["config"] == baseline and r["runnable"]}
    for r in rows:
        if not r["runnable"]:
            continue
        b = bases.get(r.get("scenario"), {})
        r["t95_x"] = ratio(r["t95"], b.get("t95"))
        r["moved_x"] = ratio(r["moved_mb"], b.get("moved_mb"))
        r["moved_d"] = diff(r["moved_mb"], b.get("moved_mb"))
        r["held_d"] = diff(r["held"], b.get("held"))
        r["accesses_x"] = ratio(r["accesses_per_s"], b.get("accesses_per_s"))
        r["moved_per_hot"] = ratio(r["moved_mb"], r.get("hot_mb"))
    return rows


def _f(x, fmt: str, none: str = "n/a") -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return none
    return format(x, fmt)


def _pct(x, fmt: str = ".0f", none: str = "n/a") -> str:
    return _f(None if x is None else x * 100, fmt, none)


COLUMNS = (f"{'scenario':<15} {'config':<20} {'t95 s':>6} {'x kern':>6} {'reach':>5} "
           f"{'held %':>6} {'-kern':>5} {'MB moved':>8} {'x kern':>6} {'x hot':>5} "
           f"{'pp':>6} {'mgr s':>6} {'acc/s x':>7}")


def format_row(r: dict) -> str:
    return (f"{(r.get('scenario') or ''):<15} {r['config']:<20} {_f(r['t95'], '.1f', '--'):>6} "
            f"{_f(r.get('t95_x'), '.2f', '--'):>6} {r['reached']:>5} "
            f"{_pct(r['held'], '.1f'):>6} {_f(None if r.get('held_d') is None else r['held_d'] * 100, '+.0f', '--'):>5} "
            f"{r['moved_mb']:>8.1f} {_f(r.get('moved_x'), '.2f', '--'):>6} "
            f"{_f(r.get('moved_per_hot'), '.1f', '--'):>5} {_f(r['ping_pongs'], '.0f'):>6} "
            f"{_f(r['mgr_cpu_s'], '.2f'):>6} {_f(r.get('accesses_x'), '.2f'):>7}")


def format_table(rows: list[dict]) -> str:
    """The side-by-side table (about 110 columns; a blank line between scenarios), then the
    rows that could not run with their reasons."""
    out = [COLUMNS]
    prev = None
    for r in rows:
        if not r["runnable"]:
            continue
        if prev is not None and r.get("scenario") != prev:
            out.append("")
        prev = r.get("scenario")
        out.append(format_row(r))
    skipped = [r for r in rows if not r["runnable"]]
    if skipped:
        out.append("")
        out.append("not run:")
        out += [f"  {(r.get('scenario') + ' ') if r.get('scenario') else ''}{r['config']}: "
                f"{r['reason']}" for r in skipped]
    return "\n".join(out)


def format_series(rows: list[dict], step: int = 5) -> str:
    """Share of the hot part on the fast node over time: ``step``-second means, in percent (a
    column ``c`` holds the ticks at ``c < t <= c + step``, times to a tenth of a second)."""
    runnable = [r for r in rows if r["runnable"]]
    if not runnable:
        return ""
    n = max((round(t, 1) for r in runnable for t, _ in r["hot_share_series"]), default=0.0)
    cols = list(range(0, max(1, math.ceil(n)), step))
    out = [f"{'hot set on fast node, % by second':<34}" + "".join(f"{c:>4}-" for c in cols)]
    prev = None
    for r in runnable:
        if prev is not None and r.get("scenario") != prev:
            out.append("")
        prev = r.get("scenario")
        s = r["hot_share_series"]
        cells = []
        for c in cols:
            m = _mean([f for t, f in s if c < round(t, 1) <= c + step])
            cells.append(f"{_pct(m, '.0f', ''):>5}")
        label = f"{r.get('scenario') or ''} {r['config']}".strip()
        out.append((f"{label:<34}" + "".join(cells)).rstrip())
    return "\n".join(out)


def format_runs(rows: list[dict]) -> str:
    """For rows of repeated runs: each run's t95, held, MB moved and ping-pongs, in the order
    they ran, so the spread behind each median shows; "" when every row is a single run."""
    multi = [r for r in rows if r["runnable"] and r.get("per_run")]
    if not multi:
        return ""
    out = ["each run (t95 s / held % / MB moved / pp); the tables show their medians:"]
    prev = None
    for r in multi:
        if prev is not None and r.get("scenario") != prev:
            out.append("")
        prev = r.get("scenario")
        label = f"{r.get('scenario') or ''} {r['config']}".strip()
        cells = [f"{_f(x['t95'], '.1f', '--')}/{_pct(x['held'], '.0f')}/"
                 f"{_f(x['moved_mb'], '.0f')}/{x['ping_pongs']}" for x in r["per_run"]]
        failed = (f"  ({len(r['failed_runs'])} could not run: {r['failed_runs'][0]})"
                  if r.get("failed_runs") else "")
        out.append(f"{label:<34} " + "  ".join(cells) + failed)
    return "\n".join(out)


def format_splits(rows: list[dict]) -> str:
    """The runs in which the kernel split huge pages to migrate them (vmstat
    thp_migration_split: the target node had no free 2 MiB block), one line; "" if none. Their
    pieces are listed as 4 KiB units from then on, and the page counts on each node shift
    between reads without anyone's moves, so such a run's MB moved is not comparable with one
    without splits."""
    runs = [f"{r.get('scenario') or ''} {r['config']} {r['vmstat']['thp_migration_split']}".strip()
            + (f" (in {r['runs']} runs)" if r.get("runs", 1) > 1 else "")
            for r in rows if r["runnable"] and (r.get("vmstat") or {}).get("thp_migration_split")]
    if not runs:
        return ""
    return "huge pages split to migrate (thp_migration_split): " + ", ".join(runs)


def format_moves(rows: list[dict]) -> str:
    """The daemon's move throughput in each pagetier row: MB it moved over the seconds its
    move_pages calls took (each run's, for repeated runs); "" if no row moved anything. The
    seconds are mostly the kernel copying pages, so this bounds how soon a hot set that must
    move can be on the fast node: a phase change that moves M MB needs about M / this rate
    on top of the read that sees it."""
    out = []
    for r in rows:
        if not r["runnable"] or not r.get("move_mb_s"):
            continue
        label = f"{r.get('scenario') or ''} {r['config']}".strip()
        each = [x.get("move_mb_s") for x in r.get("per_run") or ()]
        runs = ("  (runs: " + ", ".join(_f(x, ".0f") for x in each) + ")") if len(each) > 1 else ""
        out.append(f"{label:<34}{_f(r['move_mb_s'], '.0f'):>5} MB/s: {_f(r['move_mb'], '.0f')} MB "
                   f"in {_f(r['move_s'], '.1f')} s{runs}")
    if not out:
        return ""
    return "\n".join(["the daemon's moves (MB moved / seconds in move_pages, the kernel's page "
                      "copies most of it):"] + out)


def format_phases(rows: list[dict]) -> str:
    """The seconds to 95% of each phase ("--": not reached), for scenarios with more than one
    phase: the fuller-node goal is per phase, and a mean hides a slow one. Under a pagetier
    run, the same in its daemon's intervals (the median time between its reads)."""
    runnable = [r for r in rows if r["runnable"] and len(r.get("t95_phases") or ()) > 1]
    if not runnable:
        return ""
    out = [f"{'t95 s by phase':<34}" + "".join(
        f"{i:>6}" for i in range(max(len(r["t95_phases"]) for r in runnable)))]
    for r in runnable:
        label = f"{r.get('scenario') or ''} {r['config']}".strip()
        out.append(f"{label:<34}" + "".join(f"{_f(t, '.1f', '--'):>6}" for t in r["t95_phases"]))
        if r.get("t95_intervals"):
            label = f"  in intervals of {r['interval_s']:.2f} s"
            out.append(f"{label:<34}" + "".join(f"{_f(t, '.1f', '--'):>6}"
                                                for t in r["t95_intervals"]))
    return "\n".join(out)


def format_programs(rows: list[dict]) -> str:
    """The third-party programs' rows: their memory's share on the fast node (no hot part is
    known beforehand: the whole memory, which fits in the budget), MB moved and the program's
    own throughput figure beside kernel tiering's and no migration's; '' when none ran."""
    progs = [r for r in rows if r["runnable"] and r.get("program_unit")]
    if not progs:
        return ""
    base = {(r.get("scenario"), r["config"]): r for r in progs}
    out = ["third-party programs (their memory's share on the fast node from numa_maps, once a "
           "second; no hot part is known beforehand; throughput: the program's own figure):",
           f"{'scenario':<16} {'config':<20} {'t95 s':>6} {'held %':>6} {'MB moved':>8} "
           f"{'throughput':>22} {'x kern':>6} {'x none':>6}"]
    for r in progs:
        k = base.get((r.get("scenario"), "kernel"), {}).get("program_rate")
        n = base.get((r.get("scenario"), "none"), {}).get("program_rate")
        rate = r.get("program_rate")
        out.append(f"{r.get('scenario') or '':<16} {r['config']:<20} {_f(r['t95'], '.1f', '--'):>6} "
                   f"{_pct(r['held'], '.1f'):>6} {r['moved_mb']:>8.1f} "
                   f"{_f(rate, '.1f', '--') + ' ' + r['program_unit']:>22} "
                   f"{_f(ratio(rate, k), '.2f', '--'):>6} {_f(ratio(rate, n), '.2f', '--'):>6}")
    return "\n".join(out)


def format_limits(rows: list[dict]) -> str:
    """For pagetier's runs: how many of the daemon's intervals wanted moves, by the limit that
    stopped each exchange where it did (candidates: all it wanted moved), and the MB they
    wanted beside the MB the daemon moved; '' when no row has the figures."""
    runs = [r for r in rows if r["runnable"] and r.get("limits")]
    if not runs:
        return ""
    out = ["why the daemon's exchanges stopped (intervals that wanted moves, by the limit that "
           "bound them; MB wanted over the run, MB the daemon moved):"]
    for r in runs:
        lim = ", ".join(f"{k} {v}" for k, v in sorted(r["limits"].items(), key=lambda kv: -kv[1]))
        out.append(f"{(r.get('scenario') or '') + ' ' + r['config']:<36} {lim}; wanted "
                   f"{_f(r.get('wanted_mb'), '.0f', '--')} MB, moved {_f(r.get('move_mb'), '.0f', '--')} MB")
    return "\n".join(out)


def _no_later(t95: float, t95_x: float) -> bool:
    """t95 no later than kernel tiering's (t95 / t95_x). The workload's ticks drift by
    milliseconds: a t95 of 1.01 s against 1.0 s is the same tick."""
    return t95_x <= 1.0 or t95 - t95 / t95_x <= SAME_TICK_S


def family_summary(rows: list[dict]) -> str:
    """One line per pagetier configuration: in how many scenarios it reached 95% no later than
    kernel tiering, held within 5 points of it, and moved no more than it."""
    by_cfg: dict[str, list[dict]] = {}
    for r in rows:
        if r["runnable"] and r["config"].startswith("pagetier:"):
            by_cfg.setdefault(r["config"], []).append(r)
    out = []
    for cfg, rs in by_cfg.items():
        n = sum(1 for r in rs if r.get("held_d") is not None)
        if not n:
            continue
        faster = sum(1 for r in rs if r["t95"] is not None and
                     (r.get("t95_x") is None or _no_later(r["t95"], r["t95_x"])))
        held = sum(1 for r in rs if r.get("held_d") is not None and r["held_d"] >= -0.05)
        lighter = sum(1 for r in rs if r.get("moved_d") is not None and r["moved_d"] <= 0)
        out.append(f"{cfg}: against kernel tiering in {n} scenario(s): reached 95% no later in "
                   f"{faster}, held within 5 points in {held}, moved no more in {lighter}")
    return "\n".join(out)
