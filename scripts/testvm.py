"""The two-node NUMA test VM: boot a Debian kernel under QEMU (virtme-ng), run a command, check dmesg.

A developer tool of the checkout, not part of the installed package: ``scripts/vm`` runs it
(``scripts/vm --kernel 6.12 -- CMD``); the tests, the benchmark scripts, ``pagetier demo`` and
``pagetier bench live`` load it through ``pagetier.checkout.test_vm()``.

The host's file system is shared into the guest read-only, the repository included; results come
back through a read-write directory. By default node 0 is fast and holds the CPUs, node 1 is slow
and CPU-less. A run fails loudly when the guest's dmesg shows an Oops, BUG, WARNING or a corrupted
page table, whatever the command's own exit status.
"""
from __future__ import annotations

import glob
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import click

from pagetier.checkout import in_guest  # noqa: F401  (the guest side asks this module too)
from pagetier.errors import PagetierError, Unavailable

REPO = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent

# Lines in a guest's kernel log that mean the kernel is unhealthy.
KERNEL_REPORT = re.compile(
    r"(Oops|BUG[: ]|WARNING:|Corrupted page table|general protection fault|Kernel panic"
    r"|rcu_sched self-detected stall|rcu: INFO: rcu_.* stall|possible circular locking"
    r"|possible recursive locking|INFO: task .* blocked for more than|page dumped because"
    r"|Bad page (state|map))"
)
# Lines that match the pattern but are boot-time notices about the emulated machine, not faults.
BENIGN = re.compile(r"(Spectre V2 : WARNING: Unprivileged eBPF|Unknown kernel command line)")


class VMError(PagetierError):
    pass


@dataclass
class VMResult:
    kernel: str
    command: str
    returncode: int
    output: str
    dmesg: str
    seconds: float
    reports: list[str] = field(default_factory=list)
    outdir: Path | None = None  # the guest's $PAGETIER_VM_OUT, kept after the run
    started: bool = True  # the guest began running the command
    vng_status: int | None = None  # vng's own exit status (negative: killed by that signal)
    console: str = ""  # the guest kernel's console (loglevel 4) and vng's messages

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.reports

    def check(self) -> "VMResult":
        """Raise VMError when the command failed or the kernel reported a problem."""
        problems = []
        if self.returncode != 0:
            problems.append(f"command exited with status {self.returncode}")
        if self.reports:
            problems.append("kernel reports in dmesg:\n  " + "\n  ".join(self.reports))
        if problems:
            tail = "\n".join(self.output.splitlines()[-40:])
            trace = report_context(self.dmesg or self.console)
            raise VMError(
                f"VM run on {self.kernel} failed: {'; '.join(problems)}\n"
                f"--- command: {self.command}\n--- last output:\n{tail}"
                + (f"\n--- kernel log from the first report on:\n{trace}" if trace else "")
            )
        return self


def _is_report(line: str) -> bool:
    return bool(KERNEL_REPORT.search(line)) and not BENIGN.search(line)


def kernel_reports(dmesg: str) -> list[str]:
    return [ln for ln in dmesg.splitlines() if _is_report(ln)]


def report_context(log: str, lines: int = 80) -> str:
    """The kernel log from its first report on (the oops's registers and call trace, which
    the report lines alone leave out), at most @lines lines; "" when it reports nothing."""
    log_lines = log.splitlines()
    for i, ln in enumerate(log_lines):
        if _is_report(ln):
            return "\n".join(log_lines[max(0, i - 5):i + lines])
    return ""


def kernels() -> dict[str, str]:
    """Installed Debian kernels: {'6.1': '6.1.0-56-amd64', '6.12': '6.12.117+deb12-amd64'}."""
    found: dict[str, str] = {}
    for path in sorted(glob.glob("/boot/vmlinuz-*")):
        release = path.removeprefix("/boot/vmlinuz-")
        m = re.match(r"(\d+\.\d+)", release)
        if m and os.access(path, os.R_OK):
            # newest of each series wins (sorted order is good enough within one series)
            found[m.group(1)] = release
    return found


def resolve_kernel(kernel: str) -> str:
    ks = kernels()
    if kernel in ks:
        return ks[kernel]
    if kernel in ks.values():
        return kernel
    raise Unavailable(
        f"kernel {kernel!r} is not installed (have: {', '.join(ks) or 'none'}); "
        "run scripts/setup.sh"
    )


def _size_mb(size: str) -> int:
    m = re.fullmatch(r"(\d+)([MG])", size.strip().upper())
    if not m:
        raise VMError(f"bad memory size {size!r}: use e.g. 512M or 2G")
    return int(m.group(1)) * (1024 if m.group(2) == "G" else 1)


# The emulated CPU (vng's default is "max"), without ERMS and FSRM: with them the guest kernel
# copies with `rep movsb`, which QEMU 7.2's TCG runs a byte per step. 6.12 migrates pages with
# it (folio_mc_copy). Moving 64 MiB of huge pages by move_pages 8 times, 6.12 copied at 20-165
# MB/s and 6.1 at 110-165 MB/s with them (6.1's copy path not traced); without them, 410-630 MB/s
# after a first move at about 100 MB/s (docs/kernel-facts.md, "What a move costs")
TCG_CPU = "max,avx2=off,erms=off,fsrm=off"


def kvm_usable() -> bool:
    return os.access("/dev/kvm", os.R_OK | os.W_OK)


def run(
    command: str,
    kernel: str = "6.12",
    fast: str = "2G",
    slow: str = "2G",
    cpus: int = 2,
    kvm: bool = False,
    hmat: bool = False,
    timeout: float = 1800,
    echo: bool = False,
    env: dict[str, str] | None = None,
) -> VMResult:
    """Boot ``kernel`` with a fast node (the CPUs, ``fast`` memory) and a CPU-less slow node
    (``slow`` memory), run ``command`` with sh in the repository, and return what happened.

    ``hmat`` describes node 1 as slower memory through ACPI HMAT, so 6.12 puts it in a lower
    memory tier. The caller decides whether a failure raises: see VMResult.check().
    """
    release = resolve_kernel(kernel)
    if shutil.which("qemu-system-x86_64") is None:
        raise Unavailable("qemu-system-x86_64 is missing: run scripts/setup.sh")
    vng = shutil.which("vng", path=f"{VENV_BIN}:{os.environ.get('PATH', '')}")
    if vng is None:
        raise Unavailable(f"virtme-ng (vng) is missing: not beside {sys.executable} nor in PATH: "
                          "run scripts/setup.sh, and run this with the venv's python "
                          "(.venv/bin/python)")
    fast_mb, slow_mb = _size_mb(fast), _size_mb(slow)
    if kvm and not kvm_usable():
        raise Unavailable("--kvm asked for, but /dev/kvm is not usable here")
    res = _boot(vng, release, kernel, command, fast_mb, slow_mb, cpus, kvm, hmat, timeout, echo, env)
    if res.started or res.seconds >= timeout:
        return res
    # The guest died before it ran a line of the command (a boot-time failure of the emulated
    # machine, not of what runs in it): say so, with the console's tail, and boot once more.
    # Its kernel reports are shown but do not fail the run: nothing of ours had run (no command,
    # no module), and under software emulation a boot now and then dies in the kernel's own
    # code patching ("Oops: int3" 3.7 s into a 6.12 boot, once in about ten boots)
    boot_reports = kernel_reports(res.console)
    note = (f"[pagetier vm: the {release} guest stopped before the command started (vng exit "
            f"{res.vng_status} after {res.seconds:.0f} s)"
            + "".join(f"\n[pagetier vm: kernel report while booting: {r}]" for r in boot_reports)
            + "; console tail:\n" + _tail(res.console, 30) + "\n[pagetier vm: booting again]\n")
    if echo:
        sys.stdout.write(note)
        sys.stdout.flush()
    again = _boot(vng, release, kernel, command, fast_mb, slow_mb, cpus, kvm, hmat, timeout, echo,
                  env)
    again.output = note + again.output
    again.seconds += res.seconds
    return again


def _exit_on_signal(signum, frame):
    raise SystemExit(128 + signum)


def _tail(text: str, n: int) -> str:
    return "\n".join(text.splitlines()[-n:]) or "(empty)"


def _boot(vng, release, kernel, command, fast_mb, slow_mb, cpus, kvm, hmat, timeout, echo,
          env) -> VMResult:
    out_root = REPO / "build" / "vm"
    out_root.mkdir(parents=True, exist_ok=True)
    outdir = Path(tempfile.mkdtemp(prefix=f"{kernel}-", dir=out_root))
    exports = {"PAGETIER_IN_GUEST": "1", "PAGETIER_VM_OUT": str(outdir),
               "PATH": f"{VENV_BIN}:/usr/sbin:/usr/bin:/sbin:/bin", "PYTHONUNBUFFERED": "1",
               "HOME": "/tmp"}
    exports.update(env or {})
    runner = outdir / "runner.sh"
    runner.write_text(
        "#!/bin/sh\n"
        + f": > {outdir}/started\n"
        + _cache_mounts(outdir)
        # the guest kernel's proactive compaction off: under software emulation kcompactd's
        # page clearing can run past the RCU stall timeout (a 6.1 guest logged a self-detected
        # stall in proactive_compact_node); compaction on demand is unchanged
        + "echo 0 > /proc/sys/vm/compaction_proactiveness 2>/dev/null\n"
        + "".join(f"export {k}={shlex.quote(v)}\n" for k, v in exports.items())
        + f"cd {shlex.quote(str(REPO))}\n"
        + f"sh -c {shlex.quote(command)} < /dev/null 2>&1\n"
        + f"echo $? > {outdir}/rc\n"
        + f"dmesg > {outdir}/dmesg\n"
    )
    # vng --verbose shows the kernel console: it and vng's own messages (stderr) go to a file,
    # at loglevel 4 (errors and worse), so a guest that dies while booting leaves a trace.
    args = [vng, "--run", f"/boot/vmlinuz-{release}", "--cpus", str(cpus),
            "--memory", f"{fast_mb + slow_mb}M", "--rwdir", str(outdir), "--cwd", str(REPO),
            "--verbose", "--append", "loglevel=4"]
    if not kvm:
        # QEMU 7.2's emulated AVX2 gathers raised a #GP in a correct numpy loop in the guest
        # (vpgatherqq in the daemon, which is no target): guests get no AVX2 under emulation
        args += ["--disable-kvm", "--qemu-opt=-cpu", f"--qemu-opt={TCG_CPU}"]
        # QEMU 7.2's TCG runs CMPXCHG16B through a helper that reads a stale flags state: a 6.12
        # guest took a double fault right after SLUB's per-CPU cmpxchg16b, its EFLAGS the low
        # half of RDI. The kernel is told the CPU lacks it and uses its own fallback; user space
        # still sees CX16 (numpy's wheels require x86-64-v2, which has it)
        args[args.index("loglevel=4")] = "loglevel=4 clearcpuid=cx16"
    # a PC machine with the root on 9p, which the cached exports below need (vng would pick
    # virtio-fs and a microvm where virtiofsd runs)
    args += ["--force-9p", "--disable-microvm", f"--qemu-opts={_export_opts()}"]
    if hmat:
        # "=" form: the value starts with "-", which argparse would take for an option
        args += [f"--qemu-opts={_hmat_opts(fast_mb, slow_mb, cpus)}"]
    else:
        args += ["--numa", f"{fast_mb}M,cpus=0-{cpus - 1}", "--numa", f"{slow_mb}M"]
    args += ["--exec", f"sh {runner}"]
    t0 = time.monotonic()
    lines: list[str] = []
    console_file = outdir / "console"
    with open(console_file, "w") as console:
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=console, text=True,
                                errors="replace", start_new_session=True,
                                env={**os.environ,
                                     "PATH": f"{VENV_BIN}:{os.environ.get('PATH', '')}"})

        def kill_all():
            # vng's QEMU is its child and holds our pipe: kill the whole session, or it runs on
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

        watchdog = threading.Timer(timeout, kill_all)  # a hung guest prints nothing: kill it
        watchdog.start()
        # SIGTERM (a killed test run) would end this process without the cleanup below and
        # leave the VM running on its own: make it an exit that runs it
        old_term = None
        if threading.current_thread() is threading.main_thread():
            if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
                old_term = signal.signal(signal.SIGTERM, _exit_on_signal)
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                lines.append(line)
                if echo:
                    sys.stdout.write(line)
                    sys.stdout.flush()
            proc.wait()
        finally:
            watchdog.cancel()
            if proc.poll() is None:
                kill_all()
                proc.wait()
            if old_term is not None:
                signal.signal(signal.SIGTERM, old_term)
    if time.monotonic() - t0 >= timeout:
        lines.append(f"\n[pagetier vm: timed out after {timeout:.0f} s]\n")
    elapsed = time.monotonic() - t0
    rc_file, dmesg_file = outdir / "rc", outdir / "dmesg"
    rc = int(rc_file.read_text().strip() or 255) if rc_file.exists() else 255
    dmesg = dmesg_file.read_text(errors="replace") if dmesg_file.exists() else ""
    console_text = console_file.read_text(errors="replace")
    output = "".join(lines)
    (outdir / "output").write_text(output)  # kept for a look after a failure
    reports = kernel_reports(dmesg)
    if not dmesg_file.exists():
        # The guest died before it could write its log: its console is all there is.
        reports = (kernel_reports(console_text) or kernel_reports(output)
                   or [f"guest did not finish (no dmesg collected; vng exit {proc.returncode}); "
                       f"console tail:\n    " + _tail(console_text, 15).replace("\n", "\n    ")])
    return VMResult(release, command, rc, output, dmesg, elapsed, reports, outdir,
                    started=(outdir / "started").exists(), vng_status=proc.returncode,
                    console=console_text)


# The repository (its .venv included) and Python's standard library, exported to the guest a
# second time and mounted over their paths with cache=loose. vng shares the host's root as
# uncached 9p, so every stat and read of a Python start-up is a request to the host, each costing
# milliseconds under emulation: `import numpy, pagetier.cli` made about 7,000 of them, and about
# 1,000 from these exports once cached. Both are read-only and nothing changes them while a
# guest runs, so the cache cannot go stale; results still go to the read-write $PAGETIER_VM_OUT,
# bound back over its path.
def _cached_exports() -> list[tuple[str, Path]]:
    return [("ptrepo", REPO), ("ptstdlib", Path(sysconfig.get_paths()["stdlib"]))]


def _export_opts() -> str:
    return " ".join(
        f"-fsdev local,id={tag},path={path},security_model=none,readonly=on,multidevs=remap "
        f"-device virtio-9p-pci,fsdev={tag},mount_tag={tag}"
        for tag, path in _cached_exports())


def _cache_mounts(outdir: Path) -> str:
    """Guest shell lines mounting the cached exports; where one fails the guest goes on with
    the uncached path, and says so."""
    opts = "ro,trans=virtio,version=9p2000.L,cache=loose,msize=524288"
    out, keep = shlex.quote(str(outdir)), "/run/pagetier-vm-out"
    repo = shlex.quote(str(REPO))
    lines = [f"if mkdir -p {keep} && mount --bind {out} {keep} && "
             f"mount -t 9p -o {opts} ptrepo {repo}; then "
             f"mount --bind {keep} {out} || umount {repo}; fi\n"
             f"mountpoint -q {repo} || "
             "echo 'pagetier vm: the repository is not cached in the guest' >&2\n"]
    for tag, path in _cached_exports()[1:]:
        lines.append(f"mount -t 9p -o {opts} {tag} {shlex.quote(str(path))} || "
                     f"echo 'pagetier vm: {path} is not cached in the guest' >&2\n")
    return "".join(lines)


def _hmat_opts(fast_mb: int, slow_mb: int, cpus: int) -> str:
    """QEMU options for two nodes where node 1 is CPU-less and slower, described by HMAT."""
    return " ".join([
        "-machine hmat=on",
        f"-object memory-backend-ram,id=m0,size={fast_mb}M",
        f"-object memory-backend-ram,id=m1,size={slow_mb}M",
        f"-numa node,nodeid=0,memdev=m0,cpus=0-{cpus - 1},initiator=0",
        "-numa node,nodeid=1,memdev=m1,initiator=0",
        "-numa hmat-lb,initiator=0,target=0,hierarchy=memory,data-type=access-latency,latency=10",
        "-numa hmat-lb,initiator=0,target=0,hierarchy=memory,data-type=access-bandwidth,bandwidth=10G",
        "-numa hmat-lb,initiator=0,target=1,hierarchy=memory,data-type=access-latency,latency=40",
        "-numa hmat-lb,initiator=0,target=1,hierarchy=memory,data-type=access-bandwidth,bandwidth=2G",
    ])


@click.group("vm", context_settings={"help_option_names": ["-h", "--help"]})
def command():
    """Boot the two-node NUMA test VM and run commands in it."""


@command.command("run")
@click.option("--kernel", "-k", default="6.12", show_default=True, help="6.1, 6.12 or a full release")
@click.option("--fast", default="2G", show_default=True, help="memory of node 0 (fast, with the CPUs)")
@click.option("--slow", default="2G", show_default=True, help="memory of node 1 (slow, no CPUs)")
@click.option("--cpus", default=2, show_default=True)
@click.option("--kvm", is_flag=True, help="use KVM instead of software emulation")
@click.option("--hmat", is_flag=True, help="describe node 1 as a slower memory tier (HMAT)")
@click.option("--timeout", default=1800, show_default=True, help="seconds")
@click.argument("cmd", nargs=-1, required=True)
def run_cmd(kernel, fast, slow, cpus, kvm, hmat, timeout, cmd):
    """Run CMD in the VM (in the repository), print its output, fail on a kernel report.

    \b
    Examples:
      scripts/vm -- numactl -H
      scripts/vm --kernel 6.1 -- pagetier kmod load
    """
    res = run(" ".join(shlex.quote(c) for c in cmd), kernel=kernel, fast=fast, slow=slow,
              cpus=cpus, kvm=kvm, hmat=hmat, timeout=timeout, echo=True)
    for r in res.reports:
        click.echo(f"pagetier vm: kernel report: {r}", err=True)
    click.echo(f"pagetier vm: {res.kernel}: exit {res.returncode} in {res.seconds:.0f} s", err=True)
    sys.exit(0 if res.ok else (res.returncode or 1))


@command.command("kernels")
def kernels_cmd():
    """List the installed kernels the VM can boot."""
    for series, release in kernels().items():
        click.echo(f"{series}\t{release}")


def main():
    from pagetier.errors import PagetierError

    try:
        command.main(prog_name="scripts/testvm.py", standalone_mode=True)
    except PagetierError as e:
        click.echo(f"pagetier vm: {e}", err=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
