"""PyTorch integration of pagetier.annotate: layer boundaries and tensors from a model's hooks.
It talks to the daemon through pagetier.annotate, in pagetier/protocol.py's wire format.

    import torch
    from pagetier import annotate, torch_hooks

    model = MyModel()
    hooks = torch_hooks.instrument(model)          # before training
    for step in range(steps):
        if step == 1:
            annotate.start_profile()                 # profile one iteration (not the first:
        ...forward, backward, optimizer step...      # it allocates what later ones reuse)
        if step == 1:
            annotate.end_profile()
    hooks.remove()

``instrument`` hooks every leaf module (a module without children) that has parameters, or
the modules given: a forward pre-hook calls ``add_layer("fwd:<name>")`` and a backward pre-hook
``add_layer("bwd:<name>")``; a forward hook registers the module's output when it is at least
``min_activation_bytes`` (``act:<name>``). Parameters are registered once (``param:<name>``),
their gradients when they are first accumulated and whenever their storage moves
(``grad:<name>``): objects are registered by ``data_ptr()`` and storage size, again only when
the address or size changed, so the per-step cost is the layer calls and the activations.

torch is imported by the caller; this module only uses the objects it is given.
"""
from __future__ import annotations

import warnings

from pagetier import annotate as _annotate


def _extent(t) -> tuple[int, int]:
    """(address, bytes) of a tensor's storage (the whole storage: views share it)."""
    st = t.untyped_storage()
    return int(st.data_ptr()), int(st.nbytes())


class Instrumented:
    """The hooks ``instrument`` installed; ``remove()`` takes them all off."""

    def __init__(self, annotator):
        self.annotator = annotator
        self.handles = []
        self._known: dict[str, tuple[int, int]] = {}
        self.layers: list[str] = []

    def register(self, name: str, tensor) -> None:
        ext = _extent(tensor)
        if ext[1] and self._known.get(name) != ext:
            self._known[name] = ext
            self.annotator.register(name, *ext)

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles.clear()


def instrument(model, modules: dict | None = None, min_activation_bytes: int = 1 << 20,
               annotator: "_annotate.Annotator | None" = None) -> Instrumented:
    """Hook ``model`` (a torch.nn.Module); ``modules``: name -> module to hook instead of the
    leaf modules with parameters."""
    ann = annotator or _annotate._default
    # the first layer's input needs no gradient: its backward pre-hook still marks the layer
    warnings.filterwarnings("ignore", message="Full backward hook is firing when gradients are "
                            "computed with respect to module outputs")
    inst = Instrumented(ann)
    if modules is None:
        modules = {name: m for name, m in model.named_modules()
                   if name and not any(True for _ in m.children())
                   and any(True for _ in m.parameters(recurse=False))}
    for name, p in model.named_parameters():
        inst.register(f"param:{name}", p.detach())
        if hasattr(p, "register_post_accumulate_grad_hook"):
            inst.handles.append(p.register_post_accumulate_grad_hook(
                lambda param, name=name: inst.register(f"grad:{name}", param.grad)))

    for name, m in modules.items():
        inst.layers.append(name)

        def fwd_pre(mod, args, name=name):
            ann.add_layer(f"fwd:{name}")

        def fwd_post(mod, args, out, name=name):
            t = out[0] if isinstance(out, (tuple, list)) and out else out
            if hasattr(t, "untyped_storage") and t.nelement() * t.element_size() >= min_activation_bytes:
                inst.register(f"act:{name}", t.detach())

        def bwd_pre(mod, grad_out, name=name):
            ann.add_layer(f"bwd:{name}")

        inst.handles.append(m.register_forward_pre_hook(fwd_pre))
        inst.handles.append(m.register_forward_hook(fwd_post))
        inst.handles.append(m.register_full_backward_pre_hook(bwd_pre))
    return inst
