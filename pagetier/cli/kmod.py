"""`pagetier kmod load|unload|status`: manage pagetier.ko."""
from __future__ import annotations

import json
import platform
from pathlib import Path

import click

from pagetier.errors import ConfigError, PagetierError, Unavailable
from pagetier.profiler import kmod


def build_tree(release: str) -> Path:
    """Where a kernel's build tree (its headers and Makefiles) is, for `make -C kmod`."""
    return Path("/lib/modules") / release / "build"


@click.group("kmod")
def command():
    """Load, unload and inspect the pagetier kernel module."""


@command.command("load")
@click.option("--ko", type=click.Path(dir_okay=False), help="a .ko other than the one built for this kernel")
def load(ko):
    """Insert pagetier.ko built for the running kernel (refuses one built for another).

    Without a build in the checkout, the module installed for this kernel (DKMS) is loaded
    with modprobe."""
    release = platform.release()
    if ko and not Path(ko).exists():
        raise ConfigError(f"--ko {ko}: no such file (a pagetier.ko built for {release})")
    if (not ko and not kmod.is_loaded() and not kmod.module_path().exists()
            and kmod.installed_path() is None and not build_tree(release).is_dir()):
        raise Unavailable(f"no pagetier.ko for kernel {release}: none built in this checkout, none "
                          f"installed, and this kernel has no build tree ({build_tree(release)}) "
                          f"to build one: install its headers (linux-headers-{release}) and run "
                          "`make -C kmod`, or install it with DKMS (README.md)")
    kmod.load_module(ko)
    click.echo(f"pagetier.ko {(kmod.SYSFS / 'version').read_text().strip()} loaded "
               f"on {platform.release()}")


@command.command("unload")
def unload():
    """Remove pagetier.ko; every target is detached and its pages made accessible again.
    Like rmmod, it is an error when the module is not loaded."""
    if not kmod.is_loaded():
        raise PagetierError("pagetier.ko is not loaded: nothing to unload "
                            "(`pagetier kmod status` shows the module's state)")
    kmod.unload_module()
    click.echo("pagetier.ko unloaded")


@command.command("status")
@click.option("--json", "as_json", is_flag=True)
def status(as_json):
    """Whether the module is loaded, its version, knobs and attached targets."""
    installed = kmod.installed_path()
    st = {"loaded": kmod.is_loaded(), "kernel": platform.release(),
          "built": str(kmod.module_path()) if kmod.module_path().exists() else None,
          "installed": str(installed) if installed else None}
    if st["loaded"]:
        for f in ("version", "default_scan_period_ms", "max_targets"):
            st[f] = (kmod.SYSFS / f).read_text().strip()
        st["targets"] = [dict(zip(("pid", "mode", "scans", "pages_tracked"), ln.split()))
                         for ln in (kmod.SYSFS / "targets").read_text().splitlines()]
    if as_json:
        click.echo(json.dumps(st))
        return
    click.echo(f"kernel {st['kernel']}; module built: {st['built'] or 'no'}; installed: "
               f"{st['installed'] or 'no'}; loaded: {'yes' if st['loaded'] else 'no'}")
    if st["loaded"]:
        click.echo(f"version {st['version']}, default scan period {st['default_scan_period_ms']} ms, "
                   f"max targets {st['max_targets']}")
        for t in st["targets"]:
            click.echo(f"  pid {t['pid']:>7}  {t['mode']:<5}  scans {t['scans']:>6}  pages {t['pages_tracked']}")
