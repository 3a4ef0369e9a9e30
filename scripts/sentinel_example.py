#!/usr/bin/env python3
"""Train a small MLP on the CPU, annotated for pagetier's sentinel policy.

    pagetier run --policy sentinel --fast-budget 40M --json -- \\
        python scripts/sentinel_example.py --steps 8

The model (``--depth`` Linear layers of ``--width`` x ``--width`` floats, a ReLU between them)
is hooked with pagetier.torch_hooks (or, with ``--framework numpy``, written in numpy and
annotated by hand): its parameters, gradients and large activations are registered, and every
layer's forward and backward start is a layer boundary. Iteration ``--profile-step`` is
profiled. Each iteration prints a JSON line (loss, seconds, and the
fraction of the parameters on each NUMA node, asked with move_pages); the last line is
``{"event": "done", ...}``. ``--events FILE`` writes the same lines to FILE as well: under
``pagetier run --json`` stdout also carries the daemon's lines, and FILE holds the example's
alone. Without a daemon the annotations are no-ops and it just trains.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np


def nodes_of(extents) -> dict:
    """Fraction of the pages of ``extents`` ((address, bytes) pairs) on each node (negative:
    -errno, e.g. not present)."""
    from pagetier.core import mover

    addrs = [np.arange(lo & ~4095, lo + n, 4096, dtype=np.uint64) for lo, n in extents]
    nodes = mover.query_nodes(0, np.concatenate(addrs))
    vals, counts = np.unique(nodes, return_counts=True)
    return {str(int(v)): round(int(c) / len(nodes), 4) for v, c in zip(vals, counts)}


class TorchMLP:
    """torch.nn Linear layers with ReLUs, SGD; annotated by pagetier.torch_hooks."""

    def __init__(self, args):
        import torch

        from pagetier import torch_hooks

        self.torch = torch
        torch.manual_seed(0)
        layers = []
        for i in range(args.depth):
            layers.append(torch.nn.Linear(args.width, args.width))
            if i < args.depth - 1:
                layers.append(torch.nn.ReLU())
        self.model = torch.nn.Sequential(*layers)
        self.x = torch.randn(args.batch, args.width)
        self.y = torch.tanh(self.x @ torch.randn(args.width, args.width) / args.width ** 0.5)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=args.lr)
        self.hooks = torch_hooks.instrument(self.model, min_activation_bytes=args.min_activation_kb << 10)

    def step(self) -> float:
        loss = self.torch.nn.functional.mse_loss(self.model(self.x), self.y)
        self.opt.zero_grad(set_to_none=False)  # gradients keep their storage: registered once
        loss.backward()
        self.opt.step()
        return loss.item()

    def params(self) -> list:
        return [(p.untyped_storage().data_ptr(), p.untyped_storage().nbytes())
                for p in self.model.parameters()]

    def close(self) -> None:
        self.hooks.remove()


class NumpyMLP:
    """The same network in numpy, forward and backward by hand, annotated with
    pagetier.annotate directly: what an application without a framework does."""

    def __init__(self, args):
        from pagetier import annotate

        self.ann, self.lr = annotate, args.lr
        self.min_act = args.min_activation_kb << 10
        rng = np.random.default_rng(0)
        w, n = args.width, args.depth
        self.W = [(rng.standard_normal((w, w)) / w ** 0.5).astype(np.float32) for _ in range(n)]
        self.b = [np.zeros(w, np.float32) for _ in range(n)]
        self.gW = [np.zeros_like(a) for a in self.W]
        self.x = rng.standard_normal((args.batch, w)).astype(np.float32)
        self.y = np.tanh(self.x @ rng.standard_normal((w, w)).astype(np.float32) / w ** 0.5)
        for i in range(n):
            annotate.register(f"param:{i}.weight", self.W[i].ctypes.data, self.W[i].nbytes)
            annotate.register(f"grad:{i}.weight", self.gW[i].ctypes.data, self.gW[i].nbytes)

    def step(self) -> float:
        hs, zs = [self.x], []
        n = len(self.W)
        for i in range(n):
            self.ann.add_layer(f"fwd:{i}")
            z = hs[-1] @ self.W[i] + self.b[i]
            if z.nbytes >= self.min_act:
                self.ann.register(f"act:{i}", z.ctypes.data, z.nbytes)
            zs.append(z)
            hs.append(np.maximum(z, 0) if i < n - 1 else z)
        diff = hs[-1] - self.y
        loss = float(np.mean(diff * diff))
        g = 2 * diff / diff.size
        for i in reversed(range(n)):
            self.ann.add_layer(f"bwd:{i}")
            if i < n - 1:
                g = g * (zs[i] > 0)
            np.matmul(hs[i].T, g, out=self.gW[i])
            gb = g.sum(axis=0)
            g = g @ self.W[i].T
            self.W[i] -= self.lr * self.gW[i]
            self.b[i] -= self.lr * gb
        return loss

    def params(self) -> list:
        return [(a.ctypes.data, a.nbytes) for a in self.W]

    def close(self) -> None:
        pass


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--framework", choices=("torch", "numpy"), default="torch",
                    help="torch (default), or numpy: the same MLP by hand, without torch (whose "
                         "import takes minutes in an emulated VM)")
    ap.add_argument("--steps", type=int, default=8, help="training iterations (default 8)")
    ap.add_argument("--width", type=int, default=1024, help="layer width (default 1024: 4 MiB a layer)")
    ap.add_argument("--depth", type=int, default=4, help="Linear layers (default 4)")
    ap.add_argument("--batch", type=int, default=64, help="batch size (default 64)")
    ap.add_argument("--profile-step", type=int, default=1, help="the iteration profiled (default 1)")
    ap.add_argument("--min-activation-kb", type=int, default=256,
                    help="register activations at least this big (default 256 KiB)")
    ap.add_argument("--lr", type=float, default=0.5, help="SGD learning rate (default 0.5)")
    ap.add_argument("--events", type=argparse.FileType("w"), metavar="FILE",
                    help="also write the event lines to FILE (stdout only by default)")
    args = ap.parse_args(argv)

    def emit(event: dict) -> None:
        line = json.dumps(event)
        print(line, flush=True)
        if args.events:
            args.events.write(line + "\n")
            args.events.flush()

    for key in ("steps", "width", "depth", "batch"):
        if getattr(args, key) < 1:
            ap.error(f"--{key} must be >= 1")

    from pagetier import annotate

    t0 = time.monotonic()
    model = (TorchMLP if args.framework == "torch" else NumpyMLP)(args)
    setup_s = time.monotonic() - t0
    params = sum(n for _, n in model.params())
    emit({"event": "start", "framework": args.framework, "setup_s": round(setup_s, 2),
          "param_bytes": params, "annotations": annotate.enabled()})

    losses = []
    for step in range(args.steps):
        t = time.monotonic()
        profiling = step == args.profile_step
        if profiling:
            annotate.start_profile()
        losses.append(model.step())
        if profiling:
            annotate.end_profile()
        emit({"event": "step", "step": step, "loss": round(losses[-1], 6),
              "s": round(time.monotonic() - t, 3), "profiled": profiling,
              "param_nodes": nodes_of(model.params())})
    model.close()
    emit({"event": "done", "steps": args.steps, "first_loss": losses[0],
          "last_loss": losses[-1], "s": round(time.monotonic() - t0, 2)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
