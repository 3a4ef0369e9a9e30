"""Errors a user sees: each names what is wrong and what to do."""


class PagetierError(Exception):
    """Base class; the CLI prints these as 'pagetier: <message>' and exits 1."""


class ConfigError(PagetierError):
    """A bad option, config key or value."""


class Unavailable(PagetierError):
    """The kernel or machine lacks what a part needs (a module, DAMON, bcc, a NUMA node)."""
