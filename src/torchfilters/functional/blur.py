"""Selective blur: blur only the pixels that pass a threshold or a mask."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Union

import torch
from torch import Tensor

from .. import _ops, _spec
from .._docs import docfiller
from .._validate import (
    check_bool,
    check_dense,
    check_has_values,
    check_out,
    check_real,
    type_name,
)
from ..backends import check_backend
from ._core import (
    _blur_run_text,
    _eager_engine,
    _flat,
    _mergeable,
    _signbit,
    dense_recipe,
    no_grad_out,
    prep,
    refuse_forward_ad,
    weights_tuple,
)
from .gaussian import checked_taps_args

__all__ = ["selective_blur"]

Number = Union[int, float]


@docfiller(
    scipy=(
        "``numpy.where(m, blur(x), x)`` (blend) or\n"
        "``numpy.where(m & (den > 0), blur(m * x) / den, x)`` with ``den = blur(m)``,\n"
        "both blurred with ``cval=0`` (normalized), where ``blur`` is\n"
        "``scipy.ndimage.correlate(., weights, mode=mode, cval=cval)`` (the\n"
        "binomial by default) or ``scipy.ndimage.gaussian_filter(., sigma,\n"
        "mode=mode, cval=cval, truncate=truncate)``; with ``keep_border`` only\n"
        "the pixels inside the band are written"
    ),
)
def selective_blur(
    input: Tensor,
    threshold: float = 0.0,
    *,
    mask: Tensor | None = None,
    sigma: None | Number | Sequence[Number] = None,
    weights=None,
    normalized: bool = False,
    keep_border: bool = False,
    mode: str = "reflect",
    cval: float = 0.0,
    truncate: float = 4.0,
    axes=None,
    out: Tensor | None = None,
    backend: str | None = None,
) -> Tensor:
    """Blur only the pixels that pass a test, in one fused pass (and one backward).

    The selected pixels are ``m = input >= threshold`` or, when given, the
    boolean ``mask`` (broadcastable to ``input``; ``threshold`` is then
    ignored).  The blur kernel is ``weights`` (one dimension per axis of
    ``axes``, in increasing axis order; centred), a Gaussian of ``sigma``
    (with ``truncate``), or by default the binomial ``[1, 2, 1] / 4`` along
    each axis (in 2-D the 3x3 ``[1, 2, 1]^T [1, 2, 1] / 16``).

    * ``normalized=False`` (blend): ``y = where(m, blur(x), x)``.  The blur
      reads every neighbour's original value.  Gradient:
      ``dL/dx = blur^T(m * g) + (1 - m) * g``.
    * ``normalized=True``: inside the mask, the weighted mean over the *masked*
      neighbours only, ``blur(m * x) / blur(m)``, so excluded outliers never
      leak in; pixels with no masked neighbour (``blur(m) = 0``) are kept.
      The image and the mask are both extended by ``mode``; in ``constant``
      mode nothing outside the image counts as masked, so ``cval`` is unused.
      Weights must be non-negative.  Gradients are finite everywhere.

    The mask carries no gradient.  ``keep_border=True`` leaves untouched every
    pixel whose kernel footprint leaves the image (a band of the kernel
    radius).

    Args:
        %(input)s
        %(threshold)s
        %(mask)s
        %(sigma)s
            Default None (the kernel is ``weights``, or the binomial);
            ``sigma=0`` keeps every pixel.
        %(blur_weights)s
        %(blur_normalized)s
        %(keep_border)s
        %(mode)s
            With ``normalized=True`` the mask is extended by ``mode`` too,
            and ``'constant'`` counts nothing outside the image as masked.
        %(cval)s
        %(truncate)s
        %(axes)s
        %(out)s
        %(backend)s

    Returns:
        %(returns)s

    Raises:
        TypeError: ``mask`` not a bool tensor, or sparse; ``threshold`` or
            ``sigma`` not a real number; ``weights`` of a bad type;
            ``normalized``/``keep_border`` not a bool.
        ValueError: both ``sigma`` and ``weights``; ``mask`` not broadcastable
            to ``input``, on another device or a meta tensor; NaN
            ``threshold``; negative ``weights`` with ``normalized=True``; bad
            ``sigma``/``truncate`` (as :func:`gaussian_filter`) or ``weights``
            (as :func:`correlate`).
        %(raises)s

    %(matches)s

    Example (the GAN case):
        >>> import torch, torchfilters as tf
        >>> x = torch.tensor([[-1.0, 2.0, 2.0], [2.0, 2.0, 2.0], [2.0, 2.0, 2.0]])
        >>> tf.selective_blur(x, 0.0)[1, 1]   # the -1 leaks into its neighbours
        tensor(1.8125)
        >>> tf.selective_blur(x, 0.0, normalized=True)[1, 1]   # ... but not here
        tensor(2.)
    """
    x, lay, modes, cval = prep(input, mode, cval, axes)
    k = len(lay.axes)
    sa = lay.spec_axes
    threshold = check_real(threshold, "threshold")
    normalized = check_bool(normalized, "normalized")
    keep_border = check_bool(keep_border, "keep_border")
    if sigma is not None and weights is not None:
        raise ValueError("give at most one of sigma and weights")
    if weights is not None:
        w = weights_tuple(weights, k)
        if normalized and any(v < 0 for v in _flat(w)):  # (no tensor: torch.compile(fullgraph=True) traces it)
            raise ValueError("normalized=True needs non-negative weights (a weighted mean)")
        recipe = dense_recipe(w, lay)
    elif sigma is not None:
        sigmas, orders, radii = checked_taps_args(sigma, 0, truncate, None, k)
        recipe = ("gauss", sigmas, orders, radii, sa)
    else:
        recipe = ("binomial", sa)
    if mask is not None:
        if not isinstance(mask, Tensor):
            raise TypeError(f"mask must be a bool torch.Tensor; got {type_name(mask)}")
        check_dense(mask, "mask")
        if mask.dtype != torch.bool:
            raise TypeError(f"mask must have dtype torch.bool; got {mask.dtype} (use mask.bool() or mask != 0)")
        try:
            shape = torch.broadcast_shapes(mask.shape, x.shape)
        except RuntimeError:
            shape = None
        if shape != x.shape:
            raise ValueError(
                f"mask of shape {tuple(mask.shape)} does not broadcast to input of shape {tuple(x.shape)}"
            )
        if mask.device != x.device:
            if mask.is_meta:
                check_has_values(mask, "mask")  # the ValueError: no values
            raise ValueError(f"mask is on {mask.device} but input is on {x.device}")
        mask = mask.expand(x.shape)
    text = _blur_run_text(tuple(lay), modes, cval, normalized, keep_border, recipe, _signbit(cval))
    spec = _spec.decode(text)
    backend = check_backend(backend)
    if out is not None:
        check_out(out, x.shape, x.dtype, x.device)
        no_grad_out(x)
    given = out
    if out is not None and lay.merge and not _mergeable(out, lay.merge):
        out = None  # an out= that does not merge: through a temporary
    shape = x.shape
    x, out = lay.to_engine(x), lay.out_to_engine(out, False)
    if mask is not None:
        mask = lay.to_engine(mask)
    y = _blur(x, mask, spec, text, threshold, out, backend)
    if given is not None:
        if out is None:
            with torch.no_grad():
                given.copy_(lay.from_engine(y, False, shape))
        return given
    return lay.from_engine(y, False, shape)


def _blur(x, mask, spec, text, threshold, out, backend):
    eng = _eager_engine(x, backend)
    if eng is not None:
        if out is None:
            return eng.blur_forward(x, mask, spec, threshold)
        _ops._write(out, (x, mask), lambda o: eng.blur_forward(x, mask, spec, threshold, out=o))
        return out
    if not torch.compiler.is_compiling():
        refuse_forward_ad(x)
    if out is None:
        return _ops.blur_op(x, mask, text, threshold, backend)
    _ops.blur_out_op(x, mask, text, threshold, backend, out)
    return out


