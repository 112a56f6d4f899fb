"""Adversarial review of the rank filters, Canny and the enhance ops: one test per defect found."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.ndimage as ndi

import torchfilters.ndimage as tnd


@pytest.mark.parametrize("fn", ["minimum_filter", "maximum_filter"])
@pytest.mark.parametrize("origin", [(1, -2), (0, 0)])
def test_ndimage_minmax_size_follows_axes_order(fn, origin):
    # SciPy runs min/max with a size as 1-D passes, size[i] along axes[i]; unsorted axes
    # used to lay the sizes out in increasing axis order (wrong window, or "invalid origin")
    b = np.random.RandomState(0).rand(3, 4, 5, 6)
    kw = dict(size=(3, 4), axes=(2, 0), origin=origin, mode=["wrap", "nearest"])
    np.testing.assert_array_equal(getattr(tnd, fn)(b, **kw), getattr(ndi, fn)(b, **kw))


def test_ndimage_minmax_intermediate_in_output_dtype():
    a = (np.random.RandomState(1).randn(6, 7) * 100).astype(np.int16)
    np.testing.assert_array_equal(tnd.maximum_filter(a, size=3, output=np.int8),
                                  ndi.maximum_filter(a, size=3, output=np.int8))


def test_ndimage_minmax_cval_not_cast():
    a = (np.arange(42) + 150).astype(np.uint8).reshape(6, 7)
    np.testing.assert_array_equal(tnd.maximum_filter(a, size=3, mode="constant", cval=300.5),
                                  ndi.maximum_filter(a, size=3, mode="constant", cval=300.5))


def test_rank_filters_type_hints_resolve():
    # median/minimum/maximum_filter(1d) annotated Optional[...] without importing it: NameError
    import typing

    import torchfilters as tf

    for fn in (tf.median_filter, tf.minimum_filter, tf.maximum_filter, tf.minimum_filter1d,
               tf.maximum_filter1d, tf.rank_filter, tf.percentile_filter):
        assert "out" in typing.get_type_hints(fn)
