"""Page sizes and size parsing, in the units used everywhere (binary: K = 1024, MB = 2**20)."""
from __future__ import annotations

import re

from pagetier.errors import ConfigError

PAGE_SIZE = 4096
HUGE_PAGES = 512  # 4 KiB pages in a 2 MiB mapping
HUGE_SIZE = HUGE_PAGES * PAGE_SIZE
MB = 1 << 20  # rates are in MB/s with MB = 2**20 bytes, like sizes ("96M")
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(value, key: str = "size", where: str = "") -> int:
    """Bytes from an int or a string like "96M", "2G", "512K", "4096", "1.5G", "96MiB"."""
    pre = f"{where}: " if where else ""
    if isinstance(value, bool):
        raise ConfigError(f"{pre}{key} must be a size like \"96M\", got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ConfigError(f"{pre}{key} must not be negative, got {value}")
        return value
    if isinstance(value, str):
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?\s*", value, re.IGNORECASE)
        if m:
            return int(float(m.group(1)) * _UNITS[m.group(2).upper()])
    raise ConfigError(f"{pre}{key} must be a size like \"96M\" or \"2G\" (binary units), got {value!r}")
