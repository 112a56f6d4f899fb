"""Specs of 1, 2 or 3 spatial axes on an engine built for planes ``(..., H, W)``.

The CPU and Triton engines tile planes.  A spec that acts on one axis runs on them as planes
whose rows are the input's rows (axis ``-2``, along which the 2-D spec reads nothing: each
row is filtered alone), or, for a 1-D input or a stack of several components (whose axis
lands at -2), as planes of one row (the tensor gets a length-1 axis ``-2``, a view); a spec
of three axes that reads nothing along the first runs as the 2-D spec it is.  (Planes of
one row cost the engines their per-plane work per row: a 1-D pass along the 28-wide rows
of a ``(200, 128, 28, 28)`` batch took 2.4 times a whole 2-D Gaussian's time.)  Per-axis modes reach a
planar engine only as one mode: where the axes that a spec reads outside the image have
different modes, or a spec needs a third axis, :func:`adapt`'s entry points hand it to a
volume engine (or the reference engine).

The rule is decided here, once, for every planar engine: :func:`planar` maps a spec to
``(spec2, unsqueeze)`` or ``None``.
"""

from __future__ import annotations

from .._spec import BlurSpec, FilterSpec, Stencil, axis_mode, by_identity

__all__ = ["planar", "adapt"]


def _reads(st: Stencil, ndim: int):
    """The spatial axes along which ``st`` reads anything but offset 0."""
    return [a for a in range(-ndim, 0) if st.extent(a) != (0, 0)]


def _drop_axis(st: Stencil) -> Stencil:
    """A 3-axis stencil that reads nothing along axis -3, as a 2-axis one."""
    if st.kind == "sep":
        return st._replace(passes=tuple(p for p in st.passes if p.axis != -3))
    return st._replace(lo=st.lo[1:], taps=st.taps[0])


def _row(st: Stencil) -> Stencil:
    """A 1-axis stencil as a 2-axis one on a plane of one row."""
    if st.kind == "sep":
        return st
    return st._replace(lo=(0,) + tuple(st.lo), taps=(st.taps,))


@by_identity(256)
def _planar(spec):
    stencils = spec.stencils if isinstance(spec, FilterSpec) else (spec.stencil,)
    nd = spec.ndim
    used = sorted({a for st in stencils for a in _reads(st, nd)})
    modes = {axis_mode(spec.mode, a, nd) for a in used}
    if len(modes) > 1:
        return None
    mode = modes.pop() if modes else axis_mode(spec.mode, -1, nd)
    unsqueeze = False
    if nd == 3:
        if -3 in used or any(st.kind == "sep" and any(p.axis == -3 for p in st.passes) for st in stencils):
            return None
        if isinstance(spec, FilterSpec) and spec.epilogue == "stack" and len(stencils) > 1:
            return None  # the component axis would land between D and H
        stencils = tuple(_drop_axis(st) for st in stencils)
    elif nd == 1:
        stencils = tuple(_row(st) for st in stencils)
        unsqueeze = True
    if isinstance(spec, FilterSpec):
        out = spec._replace(mode=mode, stencils=tuple(stencils), ndim=2)
    else:
        out = spec._replace(mode=mode, stencil=stencils[0], ndim=2)
    return (spec if out == spec else out), unsqueeze


def planar(spec):
    """``(spec2, unsqueeze)``: the 2-axis, one-mode spec a planar engine runs for ``spec``
    (on the input with a length-1 axis inserted at -2 when ``unsqueeze``), or ``None`` when
    ``spec`` needs a volume engine.  Cached by identity (decoded specs are cached by text)."""
    if spec.ndim == 2 and isinstance(spec.mode, str):
        return spec, False
    return _planar(spec)


def _u(t):
    return None if t is None else t.unsqueeze(-2)


def _rows(x, spec):
    """Whether a one-axis spec (``planar``'s ``unsqueeze``) may run on ``x`` as it is: planes of
    its own rows (its output has the input's shape, and ``x`` has a row axis; a blur's output
    always has the input's shape)."""
    if x.dim() < 2:
        return False
    return not isinstance(spec, FilterSpec) or tuple(spec.out_shape(x.shape)) == tuple(x.shape)


def adapt(engine, fallback):
    """The four entry points of a planar ``engine`` (a module with ``filter_forward`` ...), for
    specs of any ``ndim``: what :func:`planar` cannot map goes to ``fallback`` (a module with
    the same four)."""

    def filter_forward(x, spec: FilterSpec, out=None):
        p = planar(spec)
        if p is None:
            return fallback.filter_forward(x, spec, out)
        s2, u = p
        if not u or _rows(x, s2):
            return engine.filter_forward(x, s2, out)
        y = engine.filter_forward(x.unsqueeze(-2), s2, _u(out))
        return out if out is not None else y.squeeze(-2)

    def filter_backward(grad, x, spec: FilterSpec, out=None):
        p = planar(spec)
        if p is None:
            return fallback.filter_backward(grad, x, spec, out)
        s2, u = p
        if not u or _rows(x, s2):
            return engine.filter_backward(grad, x, s2, out)
        y = engine.filter_backward(grad.unsqueeze(-2), x.unsqueeze(-2), s2, _u(out))
        return out if out is not None else y.squeeze(-2)

    def blur_forward(x, mask, spec: BlurSpec, threshold: float, out=None):
        p = planar(spec)
        if p is None:
            return fallback.blur_forward(x, mask, spec, threshold, out)
        s2, u = p
        if not u or _rows(x, s2):
            return engine.blur_forward(x, mask, s2, threshold, out)
        y = engine.blur_forward(x.unsqueeze(-2), _u(mask), s2, threshold, _u(out))
        return out if out is not None else y.squeeze(-2)

    def blur_backward(grad, x, mask, spec: BlurSpec, threshold: float, out=None):
        p = planar(spec)
        if p is None:
            return fallback.blur_backward(grad, x, mask, spec, threshold, out)
        s2, u = p
        if not u or _rows(x, s2):
            return engine.blur_backward(grad, x, mask, s2, threshold, out)
        y = engine.blur_backward(grad.unsqueeze(-2), x.unsqueeze(-2), _u(mask), s2, threshold, _u(out))
        return out if out is not None else y.squeeze(-2)

    return filter_forward, filter_backward, blur_forward, blur_backward
