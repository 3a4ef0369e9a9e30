"""pagetier: kernel-assisted page-access profiler and tiered-memory migration daemon."""
from pagetier.uapi import VERSION as __version__  # noqa: F401
