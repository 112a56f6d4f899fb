"""Docstring paragraphs shared by every op, and the decorator that fills them in.

SciPy's ``docfiller`` idea (``scipy/ndimage/_ni_docstrings.py``): each
argument is described once, here, and every docstring that takes it says
``%(mode)s`` where the paragraph goes.  :func:`fill` replaces each
``%(name)s`` with ``DOCS[name]`` (or a keyword given to it), indenting every
line after the first like the placeholder's line, so a paragraph lands as one
Google-style ``Args:`` item wherever it is placed.  Paragraphs may hold
placeholders themselves (``%(returns)s`` holds ``%(out_shape)s``); an op
passes the values that differ per op as keywords, e.g. the SciPy call its
``%(matches)s`` line names::

    @docfiller(scipy="``scipy.ndimage.sobel(x, axis, mode=mode, cval=cval)``")
    def sobel(...):
        '''...

        Args:
            %(input)s
            %(mode)s
        ...
        %(matches)s
        '''

Only ``%(word)s`` is special (no ``%`` escaping as with ``str %``); an
unknown name raises ``KeyError`` when the module is imported, so a typo
cannot ship.
"""

from __future__ import annotations

import re
from typing import Callable, Dict, Optional

__all__ = ["DOCS", "docfiller", "fill"]

_input = """\
input: the images, a tensor shaped ``(..., H, W)`` for the default
    ``axes=(-2, -1)`` (at least as many dimensions as ``axes`` name):
    ``H`` is axis -2 (y, rows, growing downwards), ``W`` axis -1 (x,
    columns); every index of the other axes is an independent image.
    Any device.  float16, bfloat16, float32 and float64 come back in the
    same dtype, computed in float32 (float64 for float64); integer dtypes (uint8, int16, ...)
    are promoted to float32 (they never wrap around as SciPy's uint8
    output does).  bool, complex and float8 dtypes raise ``TypeError``,
    and so do sparse, mkldnn and nested tensors (call
    ``input.to_dense()``): only dense (strided) tensors, of any strides.
    Never modified."""

_mode = """\
mode: how ``input`` is extended beyond its edges; SciPy's names and
    meanings (not ``torch.nn.functional.pad``'s).  One name for every
    axis, or a sequence of one per axis of ``axes`` (in that order),
    each axis extended by its own mode, as in SciPy.  For the row
    ``a b c d``, the samples a filter sees past each edge:

    =================  ===============================  =================
    mode               extension of ``a b c d``         torch ``F.pad``
    =================  ===============================  =================
    ``'reflect'``      ``d c b a | a b c d | d c b a``  none
    ``'mirror'``       ``d c b | a b c d | c b a``      ``'reflect'``
    ``'nearest'``      ``a a a | a b c d | d d d``      ``'replicate'``
    ``'wrap'``         ``a b c d | a b c d | a b c d``  ``'circular'``
    ``'constant'``     ``k k k k | a b c d | k k k k``  ``'constant'``
    =================  ===============================  =================

    ``'reflect'`` (the default, as in SciPy) repeats the edge sample
    (half-sample symmetric; OpenCV ``BORDER_REFLECT``).  ``'mirror'``
    does not (whole-sample symmetric; OpenCV ``BORDER_REFLECT_101``, and
    what torch calls ``'reflect'``).  ``'nearest'`` repeats the edge
    sample (OpenCV ``BORDER_REPLICATE``), ``'wrap'`` is periodic
    (``BORDER_WRAP``), ``'constant'`` fills with ``k = cval``
    (``BORDER_CONSTANT``).  SciPy's aliases are accepted:
    ``'grid-mirror'`` (= ``'reflect'``), ``'grid-wrap'`` (= ``'wrap'``)
    and ``'grid-constant'`` (= ``'constant'``).  Names are
    case-sensitive, as in SciPy; a torch, NumPy or OpenCV name
    (``'replicate'``, ``'circular'``, ``'symmetric'``,
    ``'BORDER_REFLECT_101'``, ...) raises ``ValueError`` naming the
    SciPy mode to use.  Every mode works for any kernel radius on any
    image size, a radius larger than the image and 1x1 images included
    (SciPy keeps reflecting where ``F.pad`` refuses)."""

_cval = """\
cval: the value of every sample beyond the edges with
    ``mode='constant'`` (or ``'grid-constant'``); the other modes ignore
    it.  A real number (NumPy scalars too; NaN and inf as in SciPy) or a
    one-element real tensor (a constant: one that requires grad raises
    ``ValueError``); not a bool.  Default 0.0."""

_origin = """\
origin: shifts the kernel, an int or one per axis of ``axes`` (NumPy
    integers too): along an axis of kernel size ``k`` the tap
    ``k // 2 + origin`` sits on the output pixel, so a positive origin
    moves the kernel left/up, as in SciPy.
    ``-(k // 2) <= origin <= (k - 1) // 2``. Default 0."""

_origin1d = """\
origin: shifts the kernel, an int (NumPy integers too): the tap
    ``k // 2 + origin`` of the ``k`` taps sits on the output pixel, so a
    positive origin moves the kernel left/up, as in SciPy.
    ``-(k // 2) <= origin <= (k - 1) // 2``.  Default 0."""

_axis = """\
axis: the axis to differentiate along: -1 (x, along ``W``; the default),
    -2 (y, along ``H``) or any other of ``axes``; an int (NumPy integers
    too), negative or not."""

_axis1d = """\
axis: the axis to filter along, any axis of ``input`` (default -1, x,
    along ``W``); an int (NumPy integers too), negative or not.  Every
    other axis is a batch axis."""

_axes = """\
axes: the axes to filter, 1, 2 or 3 distinct ints (negative or not, in
    any order), or one int; the others are independent batch axes.
    Arguments given per axis (``sigma``, ``order``, ``radius``,
    ``origin``, ``size``, ``mode``) follow this order, as in SciPy.
    Default None: ``(-2, -1)``, the ``(H, W)`` planes."""

_axes2 = """\
axes: the two axes of the plane, distinct ints (negative or not);
    ``atan2`` of the derivative along ``axes[0]`` and along ``axes[1]``.
    Default None: ``(-2, -1)``."""

_weights_nd = """\
weights: the kernel, one dimension per axis of ``axes`` in increasing
    axis order (``(kh, kw)`` for the default axes), the same for every
    other index, of any size (larger than the image too): a real tensor
    on any device, a NumPy array or a nested sequence of real numbers.
    Its values are read once, as constants: gradients flow to ``input``
    only, so a tensor that requires grad raises ``ValueError`` (pass
    ``weights.detach()``), as does a meta tensor (it holds no values); a
    sparse tensor raises ``TypeError`` (call ``weights.to_dense()``).
    Weights with ``|w| <= DBL_EPSILON``, and NaN weights, are left out
    of the footprint, as in SciPy (which keeps ``|w| > DBL_EPSILON``)."""

_sigma1d = """\
sigma: the standard deviation in pixels, a real number, finite and
    ``>= 0`` (0, below 1e-15: a copy)."""

_order1d = """\
order: 0 (smooth), 1 or 2 (first or second derivative of the
    Gaussian).  Default 0."""

_radius1d = """\
radius: an explicit kernel radius in pixels, a non-negative int (at
    most 2**20); overrides ``truncate``.  Default None."""

_size = """\
size: the window length per axis, an int ``>= 1`` or one per axis of
    ``axes``; an axis of size 1 is not filtered.  Default 3."""

_weights2d = """\
weights: the ``(kh, kw)`` kernel, the same for every leading index, of
    any size (larger than the image too): a real tensor on any device, a
    NumPy array or a nested sequence of real numbers.  Its values are
    read once, as constants: gradients flow to ``input`` only, so a
    tensor that requires grad raises ``ValueError`` (pass
    ``weights.detach()``), as does a meta tensor (it holds no values); a
    sparse tensor raises ``TypeError`` (call ``weights.to_dense()``).
    Weights with ``|w| <= DBL_EPSILON``, and NaN weights, are left out
    of the footprint, as in SciPy (which keeps ``|w| > DBL_EPSILON``)."""

_weights1d = """\
weights: the 1-D kernel of ``k`` taps, of any length (longer than the
    image too): a real tensor on any device, a NumPy array or a sequence
    of real numbers.  Its values are read once, as constants: gradients
    flow to ``input`` only, so a tensor that requires grad raises
    ``ValueError`` (pass ``weights.detach()``), as does a meta tensor
    (it holds no values); a sparse tensor raises ``TypeError``."""

_operator = """\
operator: the derivative stencil: ``[-1, 0, 1]`` along the axis, then a
    smoothing across it (correlation taps, SciPy's order of the passes):

    ===============  ================  ==============================
    operator         across the axis   as
    ===============  ================  ==============================
    ``'central'``    ``[1]`` (none)    ``2 * numpy.gradient`` inside
    ``'sobel'``      ``[1, 2, 1]``     ``scipy.ndimage.sobel``
    ``'scharr'``     ``[3, 10, 3]``    OpenCV ``Scharr`` (2000)
    ``'prewitt'``    ``[1, 1, 1]``     ``scipy.ndimage.prewitt``
    ===============  ================  ==============================

    Positive where intensity grows along the axis.  Default
    ``'central'``."""

_normalized = """\
normalized: ``False`` (default) keeps the integer weights above, as
    SciPy's ``sobel``/``prewitt``; ``True`` divides the result by
    exactly ``sum(|deriv|) * sum(smooth)``: 2 (central), 8 (sobel), 32
    (scharr), 6 (prewitt), so the unit ramp ``f[i, j] = j`` has slope 1.
    The result is divided, so with ``mode='constant'`` the ``cval``
    padding is too (normalized = unnormalised / divisor).  A bool
    (``numpy.bool_`` too)."""

_sigma = """\
sigma: the Gaussian's standard deviation in pixels, a number or one per
    axis of ``axes`` (a sequence, NumPy array or tensor; ``(sigma_y,
    sigma_x)`` for the default axes); finite and ``>= 0``.  An axis whose sigma is 0 (below 1e-15)
    is not filtered, as in SciPy."""

_order = """\
order: 0 (smooth), 1 or 2 (first or second derivative of the Gaussian),
    an int or one per axis of ``axes``; SciPy's kernels.  Default
    0."""

_truncate = """\
truncate: the kernel radius in sigmas:
    ``radius = int(truncate * sigma + 0.5)`` per axis (SciPy's rule),
    ``2 * radius + 1`` taps; finite and ``>= 0``.  Default 4.0."""

_radius = """\
radius: an explicit kernel radius in pixels, a non-negative int or one
    per axis of ``axes`` (at most 2**20); overrides
    ``truncate``.  Default None (from ``truncate``)."""

_threshold = """\
threshold: the pixels ``input >= threshold`` are blurred (NaN pixels
    never are); a real number, not NaN.  Ignored when ``mask`` is given.
    Default 0.0."""

_mask = """\
mask: optional bool tensor broadcastable to ``input``, on its device (a
    dense tensor): the pixels to blur, instead of ``threshold``.  It
    carries no gradient."""

_blur_weights = """\
weights: the blur kernel, one dimension per axis of ``axes`` (``(kh, kw)``
    for the default axes), placed as :func:`torchfilters.correlate` places
    it (SciPy's rule: a size ``k`` spans offsets ``-(k // 2) .. (k - 1) // 2``,
    so an even kernel reaches one further back than forward); a real tensor,
    NumPy array or nested sequence, read once, as constants; non-negative with
    ``normalized=True``.  At most one of ``sigma`` and ``weights``;
    neither gives the 3x3 binomial ``[1, 2, 1]^T [1, 2, 1] / 16``."""

_blur_normalized = """\
normalized: ``False`` (default): blend, ``y = where(m, blur(x), x)``;
    ``True``: inside the mask the weighted mean over the masked
    neighbours only, ``blur(m * x) / blur(m)`` (pixels with no masked
    neighbour are kept).  A bool (``numpy.bool_`` too)."""

_keep_border = """\
keep_border: ``True`` leaves untouched every pixel whose kernel
    footprint leaves the image (a band of the kernel radius); they still
    count as neighbours.  A bool (``numpy.bool_`` too).  Default False."""

_out = """\
out: optional tensor to write the result into, and return: the result's
    shape and dtype (float32 for integer ``input``), on ``input``'s
    device, any strides, dense, without overlapping itself (an expanded,
    stride-0 tensor raises ``ValueError``).  The only in-place path:
    ``input`` is never modified, and ``out`` may alias it (the result
    then goes through a temporary).  Like torch's ``out=``, not
    differentiable: a ``RuntimeError`` when ``input`` or ``out``
    requires grad outside ``torch.no_grad()``.  Default None (a fresh
    tensor)."""

_backend = """\
backend: the engine.  ``None`` or ``'auto'`` (default) takes the one the
    ``TORCHFILTERS_BACKEND`` environment variable names, if set, else
    the fastest that runs the tensor: ``'cpu'`` for CPU tensors,
    ``'triton'`` for CUDA tensors, ``'reference'`` otherwise; on a CPU
    tensor whose ``'cpu'`` kernel is not compiled yet, ``'reference'``
    while a background thread compiles it (``TORCHFILTERS_COMPILE=wait``
    compiles in the call; :func:`torchfilters.backends.synchronize`).
    ``'reference'`` is pure torch on any device (the oracle); ``'cpu'``
    runs fused numba kernels on CPU tensors; ``'triton'`` fused Triton
    kernels on CUDA tensors.  An engine forced here or by
    ``TORCHFILTERS_BACKEND`` that cannot run the call raises
    :class:`torchfilters.BackendUnavailableError` saying why.  The result
    does not depend on the engine beyond floating-point rounding."""

_size_foot = """\
size: the window's length per axis, an int ``>= 1`` or one per axis of
    ``axes`` (in that order): a box.  Give this or ``footprint``.
footprint: the window as a boolean tensor, NumPy array or nested sequence
    of ``len(axes)`` dimensions (in increasing axis order, as SciPy's),
    True where an element belongs to the window: any shape, holes
    allowed, at least one True.  Centred on ``shape // 2`` (shifted by
    ``origin``).  Give this or ``size``."""

_percentile = """\
percentile: in percent, ``-100 <= percentile <= 100`` (a negative one
    counts from 100)."""

_amount = """\
amount: the sharpening strength, a finite real number (0 returns
    ``input``; negative values blur).  Default 1."""

_low_sigma = """\
low_sigma: the narrower Gaussian's standard deviation in pixels, a real
    ``>= 0`` or one per axis of ``axes``.
high_sigma: the wider one's, likewise; default ``1.6 * low_sigma``."""

_rank_rule = """\
Window values are ranked as ``numpy.sort`` ranks them (ascending,
``-0.0`` equal to ``0.0``, NaN after ``+inf``), equal values in the
footprint's C order (a stable sort); the result is the element of the
chosen rank, so always a value of the window (never interpolated), and
its gradient flows to that one window element: the input sample it
reads, folded back by ``mode`` (a ``cval`` sample of ``constant`` mode
takes none).  Ties therefore send the gradient to the tied element
first (minimum), last (maximum) or at the rank's position in footprint
order; ``gradcheck`` holds on inputs without ties.  Any window size on
any image size, the window larger than the image included."""

_rank_matches = """\
SciPy: on each slice ``x`` of ``input`` along the chosen axes (``(H, W)``
by default), the same as
%(scipy)s,
bit for bit in every dtype, wherever a window holds no NaN (a tie of
``-0.0`` with ``0.0`` may give either sign).  With a NaN in the window
SciPy's result depends on which of its algorithms runs (a selection for
general ranks, Harter's MINLIST for separable minimum and maximum, a heap
for 1-D windows): ``scipy.ndimage.median_filter([1, 5, nan, 3, 2], 3)``
gives ``[1, nan, nan, nan, 2]`` (NaN last: ``[1, 5, 5, 3, 2]``) and
``maximum_filter1d`` of that row with ``size=3`` gives
``[5, 5, 5, nan, 3]``, the NaN seen by one window only.  torchfilters
orders NaN last everywhere instead, on every engine."""

_returns = """\
%(out_shape)s tensor%(out_note)s
of ``input``'s dtype (float32 for integer ``input``), on ``input``'s
device."""

_raises = """\
TypeError: ``input`` not a tensor, of dtype bool, complex or float8, or
    not dense (sparse, mkldnn, nested); ``mode`` not a str (or a
    sequence of them); an axis of ``axes`` not an int; ``cval`` not
    a real number; ``out`` not a tensor, not dense, or not of the
    result's dtype.
ValueError: ``axes`` with duplicates, out of range for ``input``, none
    or more than 3; a per-axis sequence (``mode``, ``sigma``, ...) whose
    length is not ``len(axes)``; an unknown ``mode``
    (a torch/NumPy/OpenCV name gets the SciPy name to use); a meta
    tensor for a value such as ``cval``; ``out`` of the wrong shape or
    device, or overlapping itself; an unknown ``backend`` or
    ``TORCHFILTERS_BACKEND``.
RuntimeError: ``out=`` while ``input`` or ``out`` requires grad (outside
    ``torch.no_grad()``).
BackendUnavailableError: the engine ``backend`` or
    ``TORCHFILTERS_BACKEND`` forces cannot run this call (a
    ``RuntimeError``)."""

_matches = """\
SciPy: on each slice ``x`` of ``input`` along the chosen axes (``(H, W)``
by default), the same as
%(scipy)s
(SciPy in float64; equal to floating-point rounding)."""

#: name -> paragraph.  Args paragraphs start with ``name:`` and indent their
#: continuation lines by 4 (Google style); ``fill`` adds the placeholder's indent.
DOCS: Dict[str, str] = {
    "input": _input,
    "mode": _mode,
    "cval": _cval,
    "origin": _origin,
    "origin1d": _origin1d,
    "axis": _axis,
    "axis1d": _axis1d,
    "axes": _axes,
    "axes2": _axes2,
    "weights_nd": _weights_nd,
    "size": _size,
    "sigma1d": _sigma1d,
    "order1d": _order1d,
    "radius1d": _radius1d,
    "weights2d": _weights2d,
    "weights1d": _weights1d,
    "operator": _operator,
    "normalized": _normalized,
    "sigma": _sigma,
    "order": _order,
    "truncate": _truncate,
    "radius": _radius,
    "threshold": _threshold,
    "mask": _mask,
    "blur_weights": _blur_weights,
    "blur_normalized": _blur_normalized,
    "keep_border": _keep_border,
    "out": _out,
    "backend": _backend,
    "size_foot": _size_foot,
    "percentile": _percentile,
    "amount": _amount,
    "low_sigma": _low_sigma,
    "rank_rule": _rank_rule,
    "rank_matches": _rank_matches,
    "returns": _returns,
    "out_shape": "``(..., H, W)``",
    "out_note": " (``out`` when given)",
    "raises": _raises,
    "matches": _matches,
}

_PLACEHOLDER = re.compile(r"%\((\w+)\)s")


def fill(doc: Optional[str], **extra: str) -> Optional[str]:
    """Replace every ``%(name)s`` in ``doc`` with its paragraph (``extra`` first, then ``DOCS``).

    Every line of a paragraph after the first gets the indentation of the
    line the placeholder is on; paragraphs are filled recursively.

    >>> fill("Args:\\n    %(x)s\\n", x="x: one\\n    two")
    'Args:\\n    x: one\\n        two\\n'
    """
    if doc is None:
        return None
    table = {**DOCS, **extra}

    def expand(text: str, depth: int) -> str:
        if depth > 8:
            raise RecursionError("docstring placeholders nest too deeply (a cycle?)")
        lines = []
        for line in text.split("\n"):
            indent = line[: len(line) - len(line.lstrip())]

            def sub(m):
                key = m.group(1)
                if key not in table:
                    raise KeyError(f"no docstring paragraph named {key!r} (known: {', '.join(sorted(table))})")
                first, *rest = expand(table[key], depth + 1).split("\n")
                return "\n".join([first] + [indent + r if r.strip() else "" for r in rest])

            lines.append(_PLACEHOLDER.sub(sub, line))
        return "\n".join(lines)

    return expand(doc, 0)


def docfiller(obj: Optional[Callable] = None, /, **extra: str):
    """Decorator: fill ``obj.__doc__`` (see :func:`fill`); ``@docfiller`` or ``@docfiller(scipy=...)``."""
    if obj is None:
        return lambda o: docfiller(o, **extra)
    obj.__doc__ = fill(obj.__doc__, **extra)
    return obj


# ------------------------------------------------- torchfilters.ndimage / .dask

#: the arguments after the array in each ``torchfilters.ndimage`` / ``torchfilters.dask``
#: function's docstring example (``scipy`` is ``scipy.ndimage`` there)
ND_EXAMPLE_ARGS = {
    "correlate": ", np.ones((3, 3))", "convolve": ", [[1.0, 2.0], [0.0, -1.0]]",
    "correlate1d": ", [1.0, 2.0, 1.0]", "convolve1d": ", [1.0, -1.0], mode='nearest'",
    "sobel": ", 0", "prewitt": "", "laplace": ", mode='mirror'",
    "generic_laplace": (", lambda x, axis, out, mode, cval: "
                        "scipy.correlate1d(x, [1.0, -2.0, 1.0], axis, out, mode, cval)"),
    "generic_gradient_magnitude": ", scipy.sobel",
    "gaussian_filter": ", 1.5", "gaussian_filter1d": ", 1.0, order=1", "gaussian_gradient_magnitude": ", 1.0",
    "gaussian_laplace": ", 1.0, mode='wrap'", "uniform_filter": ", 3", "uniform_filter1d": ", 4, axis=0",
    "rank_filter": ", 1, size=3", "median_filter": ", size=3", "percentile_filter": ", 25, size=(2, 3)",
    "minimum_filter": ", size=(2, 3)", "maximum_filter": ", footprint=[[0, 1, 0], [1, 1, 1]]",
    "minimum_filter1d": ", 3", "maximum_filter1d": ", 3, mode='constant', cval=9.0",
}

_nd_doc = """{summary}

A drop-in for ``scipy.ndimage.{name}``: the same arguments in the same order, the same
defaults, the same dtype rules (the result has the input's dtype, or ``output``'s; integer
results are truncated as SciPy truncates them, after every pass of a multi-pass filter) and
the same exception types for bad arguments; SciPy's documentation of ``{name}`` describes each
argument.  ``input`` is anything ``numpy.asarray`` accepts (one to three filtered axes run on
the fused kernels); the result is a NumPy array, ``output`` when one is given.  A CuPy array
(any array that dispatches NumPy's API and exports DLPack) is filtered on its device and the
result is an array of its library.  Differences
from SciPy (float16, NaN in windows, the last bit of some sums): the module docstring.

Example (SciPy's values, to floating-point rounding)::

    >>> import numpy as np, scipy.ndimage as scipy, torchfilters.ndimage as tfn
    >>> a = np.arange(42.0).reshape(6, 7) % 5
    >>> bool(np.allclose(tfn.{name}(a{args}), scipy.{name}(a{args})))
    True
"""

_dask_doc = """``torchfilters.ndimage.{name}`` on a dask array, lazily.

``image`` is a ``dask.array.Array`` (of NumPy chunks, or CuPy chunks filtered on their GPU);
the other arguments are ``scipy.ndimage.{name}``'s (without ``output``).  Returns a lazy dask array of the result's dtype, bit-identical to
``torchfilters.ndimage.{name}`` on the computed array for every chunking: each chunk is
filtered with an overlap of the filter's exact reach (the module docstring); chunks thinner
than that are merged first, with a :class:`ChunksTooSmallWarning`.  Bad arguments raise what
SciPy raises, when the call is made (not when it is computed).

Example::

    >>> import dask.array as da, numpy as np, scipy.ndimage as scipy
    >>> import torchfilters.dask as tfd, torchfilters.ndimage as tfn
    >>> a = np.arange(168.0).reshape(12, 14) % 5
    >>> x = da.from_array(a, chunks=(6, 7))
    >>> bool(np.array_equal(tfd.{name}(x{args}).compute(), tfn.{name}(a{args})))
    True
"""


def fill_ndimage(namespace: dict, names, dask: bool = False) -> None:
    """Give each function ``names`` of a module (its ``globals()``) the template docstring of
    ``torchfilters.ndimage`` (its own one-line docstring becomes the summary) or, with ``dask``,
    of ``torchfilters.dask``, with the example of :data:`ND_EXAMPLE_ARGS`."""
    for name in names:
        f = namespace[name]
        template = _dask_doc if dask else _nd_doc
        f.__doc__ = template.format(summary=(f.__doc__ or "").strip(), name=name, args=ND_EXAMPLE_ARGS[name])
