"""The docstring examples of torchfilters, torchfilters.functional, .nn, .ndimage and .dask run and pass."""

from __future__ import annotations

import doctest
import importlib
import importlib.util
import pkgutil

import pytest
import torch

import torchfilters.functional  # noqa: E402

#: every module of the functional package (a new one is found, not listed), and the others with examples
MODULES = ["torchfilters", "torchfilters.nn", "torchfilters.backends", "torchfilters.backends._layout",
           "torchfilters.backends._tiered",
           "torchfilters.ndimage"] + (["torchfilters.dask"] if importlib.util.find_spec("dask") else []) + [
    f"torchfilters.functional.{m.name}" for m in pkgutil.iter_modules(torchfilters.functional.__path__)
    if not m.name.startswith("_")]


def _examples(modname):
    mod = importlib.import_module(modname)
    finder = doctest.DocTestFinder(exclude_empty=True)
    return [t for t in finder.find(mod, modname) if t.examples]


@pytest.mark.parametrize("modname", MODULES)
def test_docstring_examples(modname):
    tests = _examples(modname)
    assert tests, f"no docstring examples found in {modname}"
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    torch.manual_seed(0)
    for t in tests:
        runner.run(t)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, f"{result.failed} of {result.attempted} docstring examples failed in {modname}"


def test_every_public_function_has_an_example():
    import torchfilters

    missing = []
    for name in torchfilters.functional.__all__:
        doc = getattr(torchfilters, name).__doc__ or ""
        if ">>>" not in doc:
            missing.append(name)
    assert not missing, f"public functions without a docstring example: {missing}"
