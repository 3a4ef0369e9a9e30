"""The daemon's configuration: a TOML file (see scripts/pagetier.toml), overridden by CLI options.

Validation is strict: an unknown key, a wrong type or a bad size is a ConfigError naming the key
and where it came from. Sizes are bytes, as an integer or a string such as "96M" or "2G"
(binary units: K = 1024). Rates are MB/s with MB = 2**20 bytes.
"""
from __future__ import annotations

import dataclasses
import functools
import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from pagetier.core.units import parse_size
from pagetier.errors import ConfigError, Unavailable

NODE_ROOT = Path("/sys/devices/system/node")


@dataclass
class Config:
    policy: str = "heuristic"  # a name from pagetier.policies
    policy_options: dict = field(default_factory=dict)  # passed to policies.create
    fast_node: int = 0
    slow_node: int = 1
    fast_budget: int | None = None  # bytes the targets may keep on the fast node
    fast_free_watermark: int | None = None  # or: keep this many bytes free on the fast node
    rate: float = 512.0  # MB/s of migrations at most; 0: no limit
    interval: float = 1.0  # seconds
    profiler: str = "kmod"
    profiler_options: dict = field(default_factory=dict)  # passed to the profiler backend
    dry_run: bool = False  # decide and report, move nothing
    log_file: str | None = None
    json: bool = False  # one JSON stats line per interval on stdout
    ping_pong_window: int = 4  # a unit moved back within this many intervals is a ping-pong
    control_socket: str | None = None  # default: $PAGETIER_SOCKET, else run_dir()/control.sock
    # [[cgroup]] tables: [{"path": str, "fast_budget": bytes or None}] (daemon/cgroups.py)
    cgroup: list = field(default_factory=list)
    metrics: str | None = None  # "[ADDR:]PORT": serve Prometheus metrics there (daemon/metrics.py)
    # Not in the file: set by the command line or the caller (RUNTIME_KEYS).
    duration: float | None = None  # stop after this many seconds (--duration)
    status_file: str | None = None  # default: run_dir()/daemon-PID.json
    handle_signals: bool = True  # SIGTERM/SIGINT stop, SIGHUP reloads (main thread only)
    node_root: Path = NODE_ROOT  # sysfs nodes (meminfo)
    zoneinfo: Path = Path("/proc/zoneinfo")  # the fast node's watermarks
    config_path: str | None = field(default=None, compare=False)  # the file SIGHUP reloads
    overrides: dict | None = field(default=None, compare=False)  # the command line's, kept on reload
    source: str = field(default="defaults", compare=False)  # where the values came from

    def check(self) -> None:
        where = self.source
        if self.interval <= 0:
            raise ConfigError(f"{where}: interval must be > 0 seconds, got {self.interval}")
        if self.rate < 0:
            raise ConfigError(f"{where}: rate must be >= 0 MB/s (0: no limit), got {self.rate}")
        if self.fast_node == self.slow_node:
            raise ConfigError(f"{where}: fast_node and slow_node are both {self.fast_node}")
        if self.fast_node < 0 or self.slow_node < 0:
            raise ConfigError(f"{where}: node numbers must be >= 0")
        if self.fast_budget is not None and self.fast_free_watermark is not None:
            raise ConfigError(f"{where}: give fast_budget or fast_free_watermark, not both")
        if self.ping_pong_window < 1:
            raise ConfigError(f"{where}: ping_pong_window must be >= 1 interval")


# key -> (accepted python types, description for messages)
_TYPES = {
    "policy": ((str,), "a string"),
    "policy_options": ((dict,), "a table"),
    "fast_node": ((int,), "an integer"),
    "slow_node": ((int,), "an integer"),
    "fast_budget": ((int, str), "a size (bytes, or a string like \"96M\")"),
    "fast_free_watermark": ((int, str), "a size (bytes, or a string like \"1G\")"),
    "rate": ((int, float), "a number (MB/s)"),
    "interval": ((int, float), "a number (seconds)"),
    "profiler": ((str,), "a string"),
    "profiler_options": ((dict,), "a table"),
    "dry_run": ((bool,), "true or false"),
    "log_file": ((str,), "a string"),
    "json": ((bool,), "true or false"),
    "ping_pong_window": ((int,), "an integer"),
    "control_socket": ((str,), "a path"),
    "cgroup": ((list,), "an array of tables [[cgroup]] with path and fast_budget"),
    "metrics": ((str, int), "\"[ADDR:]PORT\" (e.g. \"9464\" or \"127.0.0.1:9464\")"),
}
KEYS = tuple(_TYPES)


def _validate(raw: dict, where: str) -> dict:
    out = {}
    for key, value in raw.items():
        if key not in _TYPES:
            raise ConfigError(f"{where}: unknown key {key!r} (known: {', '.join(KEYS)})")
        types, desc = _TYPES[key]
        ok = isinstance(value, types) and not (isinstance(value, bool) and bool not in types)
        if not ok:
            raise ConfigError(f"{where}: key {key!r} must be {desc}, got {type(value).__name__} {value!r}")
        if key in ("fast_budget", "fast_free_watermark"):
            value = parse_size(value, key, where)
        elif key in ("rate", "interval"):
            value = float(value)
        elif key == "cgroup":
            from pagetier.daemon.cgroups import parse_tables
            value = parse_tables(value, where)
        elif key == "metrics":
            addr, port = parse_listen(value, key, where)
            value = f"[{addr}]:{port}" if ":" in addr else f"{addr}:{port}"
        out[key] = value
    return out


def parse_value(v: str):
    """A KEY=VALUE option's value given as text: int, float, true/false, or a string."""
    low = v.lower()
    if low in ("true", "false"):
        return low == "true"
    for conv in (int, float):
        try:
            return conv(v)
        except ValueError:
            pass
    return v


def parse_listen(value, key: str = "metrics", where: str = "") -> tuple[str, int]:
    """``"[ADDR:]PORT"`` (or a port number) as (address, port). PORT alone listens on every
    IPv4 address ("0.0.0.0", as node_exporter's ":PORT" does); ``[::]:PORT`` for IPv6 too. Port 0
    takes a free one (the log and the status file say which)."""
    text = str(value).strip()
    addr, sep, port = text.rpartition(":")
    if not sep:
        addr = ""
    addr = addr.strip()
    if addr.startswith("[") and addr.endswith("]"):
        addr = addr[1:-1]
    pre = f"{where}: " if where else ""
    if not port.isdigit() or int(port) > 65535 or (":" in addr and not sep) or any(
            c.isspace() or c in "[]/" for c in addr):
        raise ConfigError(f"{pre}{key} must be \"[ADDR:]PORT\" with a port 0-65535, got {value!r}")
    return addr or "0.0.0.0", int(port)


def load(path: str | os.PathLike | None = None, overrides: dict | None = None) -> Config:
    """Config from the TOML file ``path`` (if any) with ``overrides`` (CLI options; None values
    mean "not given") applied on top. Does not check the nodes: see :func:`check_nodes`."""
    values: dict = {}
    sources = []
    if path is not None:
        where = f"config {path}"
        try:
            with open(path, "rb") as f:
                raw = tomllib.load(f)
        except FileNotFoundError:
            raise ConfigError(f"{where}: no such file")
        except OSError as e:
            raise ConfigError(f"{where}: cannot read it: {e.strerror}")
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{where}: not valid TOML: {e}")
        except UnicodeDecodeError as e:
            raise ConfigError(f"{where}: not valid TOML: not UTF-8 text (byte {e.start})")
        values.update(_validate(raw, where))
        sources.append(str(path))
    ov = {k: v for k, v in (overrides or {}).items() if v is not None}
    if ov:
        parsed = _validate(ov, "command line")
        if "fast_budget" in parsed:
            values.pop("fast_free_watermark", None)  # a CLI budget replaces a file watermark
        if "fast_free_watermark" in parsed:
            values.pop("fast_budget", None)
        for key in ("policy_options", "profiler_options"):  # CLI keys add to the file's table
            if key in parsed:
                parsed[key] = {**values.get(key, {}), **parsed[key]}
        values.update(parsed)
        sources.append("command line")
    cfg = Config(**values, config_path=None if path is None else str(path), overrides=overrides,
                 source=" + ".join(sources) or "defaults")
    cfg.check()
    return cfg


RUNTIME_KEYS = ("duration", "status_file", "handle_signals", "node_root", "zoneinfo",
                "config_path", "overrides")


def as_dict(cfg: Config) -> dict:
    """The configuration's keys (those a config file may set) and values."""
    d = dataclasses.asdict(cfg)
    for key in ("source", *RUNTIME_KEYS):
        d.pop(key)
    return d


def nodes_with_memory(root: Path = NODE_ROOT) -> list[int]:
    """Nodes that have memory, from sysfs (what `numactl -H` lists)."""
    try:
        text = (root / "has_memory").read_text().strip()
    except OSError:
        text = ",".join(p.name[4:] for p in root.glob("node[0-9]*"))
    nodes: list[int] = []
    for part in filter(None, text.split(",")):
        lo, _, hi = part.partition("-")
        nodes.extend(range(int(lo), int(hi or lo) + 1))
    return sorted(nodes)


def check_nodes(cfg: Config, root: Path = NODE_ROOT) -> None:
    """Raise Unavailable when fast_node or slow_node has no memory on this machine."""
    have = nodes_with_memory(root)
    for key in ("fast_node", "slow_node"):
        n = getattr(cfg, key)
        if n not in have:
            shown = ", ".join(map(str, have)) or "none"
            raise Unavailable(
                f"{key} {n}: no such NUMA node with memory on this machine (nodes with memory: "
                f"{shown}, as `numactl -H` shows); set {key} in the config file or --{key.replace('_', '-')}"
            )


def zone_sums(node: int, text: str | None = None,
              names: tuple[str, ...] | None = None) -> dict[str, int]:
    """The two-field lines ("high 256", "count: 7") of ``node``'s zones in /proc/zoneinfo (or
    ``text``), each name's values summed over the zones (and their per-CPU pagesets): one walk
    for every field the daemon reads. ``names``: those names' lines only (a walk that looks for
    them alone: /proc/zoneinfo has a pageset for each CPU in each zone)."""
    if text is None:
        text = Path("/proc/zoneinfo").read_text()
    sums: dict[str, int] = {}
    lines = None if names is None else _zone_lines(tuple(names))
    for section in ("\n" + text).split("\nNode ")[1:]:  # "0, zone   Normal\n  pages free ..."
        if int(section[:section.index(",")]) != node:
            continue
        if lines is not None:
            for name, value in lines.findall(section):
                sums[name] = sums.get(name, 0) + int(value)
            continue
        for line in section.splitlines()[1:]:
            parts = line.split()
            if len(parts) == 2 and parts[1].lstrip("-").isdigit():  # not "per-node stats"
                sums[parts[0]] = sums.get(parts[0], 0) + int(parts[1])
    return sums


@functools.lru_cache(maxsize=8)
def _zone_lines(names: tuple[str, ...]) -> re.Pattern:
    """The two-field lines of zone_sums whose name is one of ``names``."""
    alt = "|".join(re.escape(n) for n in names)
    return re.compile(rf"^[ \t]*({alt})[ \t]+(-?[0-9]+)[ \t]*$", re.M)


def zone_watermark(node: int, name: str = "high", text: str | None = None,
                   page_size: int = 4096, sums: dict[str, int] | None = None) -> int:
    """Bytes: the sum over ``node``'s zones of a watermark from /proc/zoneinfo (or ``text``, or
    :func:`zone_sums` already taken); "promo" falls back to "high" on kernels without it."""
    sums = zone_sums(node, text) if sums is None else sums
    return sums.get(name, sums.get("high", 0)) * page_size


def zone_pcp_pages(node: int, text: str | None = None, sums: dict[str, int] | None = None) -> int:
    """Pages: the free pages on the per-CPU lists of ``node``'s zones (the ``count:`` lines of
    /proc/zoneinfo's pagesets, or ``text``, or :func:`zone_sums` already taken). MemFree leaves
    them out until a list drains back."""
    sums = zone_sums(node, text) if sums is None else sums
    return sums.get("count:", 0)


def read_bytes(path: Path | str) -> bytes:
    """A small kernel file's content, read without Python's buffered and text layers: the
    daemon reads the fast node's meminfo and /proc/zoneinfo twice a step."""
    fd = os.open(path, os.O_RDONLY)
    try:
        chunks = []
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def node_memfree(node: int, root: Path = NODE_ROOT) -> int:
    """Bytes: ``node_meminfo(node, root)["MemFree"]``, the one field the room needs, without
    the rest of the file parsed (KeyError when it has none)."""
    text = read_bytes(os.path.join(root, f"node{node}", "meminfo"))
    at = text.find(b" MemFree:")
    if at < 0:
        raise KeyError("MemFree")
    end = text.find(b"\n", at)
    parts = (text[at:] if end < 0 else text[at:end]).split()
    return int(parts[1]) * (1024 if parts[-1] == b"kB" else 1)


def node_meminfo(node: int, root: Path = NODE_ROOT) -> dict[str, int]:
    """Bytes from /sys/devices/system/node/nodeN/meminfo (MemTotal, MemFree, ...)."""
    out = {}
    for line in (root / f"node{node}" / "meminfo").read_text().splitlines():
        # "Node 0 MemFree:        123456 kB"
        parts = line.split()
        if len(parts) >= 4:
            out[parts[2].rstrip(":")] = int(parts[3]) * (1024 if parts[-1] == "kB" else 1)
    return out
