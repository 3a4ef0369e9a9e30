"""Access-count readers behind one interface, chosen by name (see base.py)."""
from pagetier.profiler.base import PROFILERS, Profiler, Sample, create, register  # noqa: F401
