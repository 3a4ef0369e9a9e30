"""pagetier: kernel-assisted page-access profiler and tiered-memory migration daemon."""


def __getattr__(name):
    # __version__ is the UAPI header's (pagetier.uapi, which imports numpy), read at its first
    # use: commands that need no numpy, such as `pagetier status`, start without it
    if name == "__version__":
        from pagetier.uapi import VERSION

        return VERSION
    raise AttributeError(f"module 'pagetier' has no attribute {name!r}")
