"""pytest plugin: SciPy's own ``scipy/ndimage/tests/test_filters.py`` with ``scipy.ndimage``'s
filters replaced by ``torchfilters.ndimage``'s (every function torchfilters covers).

Used by ``tests/test_scipy_suite.py``, which runs SciPy's installed test file in a subprocess
with ``-p torchfilters_as_ndimage``; nothing else in SciPy is touched.
"""

import sys

import scipy.ndimage
from scipy._lib import _array_api

import torchfilters.ndimage as tfn

REPLACED = tuple(tfn.__all__)


def pytest_configure(config):
    table = _array_api.xp_capabilities_table
    for name in REPLACED:
        ours, theirs = getattr(tfn, name), getattr(scipy.ndimage, name)
        if theirs in table:  # the tests' array-API marks look functions up by identity
            table[ours] = table[theirs]
        setattr(scipy.ndimage, name, ours)
    sys.__stdout__.write(f"torchfilters.ndimage replaces scipy.ndimage.{{{', '.join(REPLACED)}}}\n")
