"""Results stay valid, and ops keep working, while the interpreter shuts down.

Each case runs in a fresh interpreter: what it checks happens only at exit.
"""

import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("numba")


def _run(code: str, **env):
    e = dict(os.environ, **env)
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=e,
                       timeout=600)
    return r.returncode, r.stdout, r.stderr


COMPILE_MODES = pytest.mark.parametrize("compile_mode", ["wait", "background"])


@COMPILE_MODES
def test_a_live_result_is_never_handed_out_again_at_exit(compile_mode):
    # weakref.finalize runs its callbacks at exit for objects still alive: a finalizer that
    # returned the buffer of a live output to the cache let a later output (here made in an
    # atexit handler registered before torch, so it runs after the finalizers') overwrite it
    rc, out, err = _run("""
        import atexit

        def late():
            y = tf.gaussian_filter(torch.full((512, 512), 9.0), 1.0)  # >= 1 MiB: a cached buffer
            assert torch.equal(KEEP, COPY), "a live result was overwritten"
            assert float((y - 9.0).abs().max()) < 1e-5
            print("late ok")

        atexit.register(late)
        import torch
        import torchfilters as tf

        KEEP = tf.gradient_magnitude(torch.rand(512, 512))
        COPY = KEEP.clone()
    """, OMP_NUM_THREADS="1", TORCHFILTERS_COMPILE=compile_mode)
    assert rc == 0, err
    assert "late ok" in out


@COMPILE_MODES
def test_ops_work_in_atexit_handlers_and_late_threads(compile_mode):
    # after the main thread returns, concurrent.futures refuses new work ("cannot schedule
    # new futures after shutdown"): the calling thread runs the whole call instead
    rc, out, err = _run("""
        import atexit, threading, time
        import torch
        import torchfilters as tf

        x = torch.rand(4, 256, 256)
        want = tf.gradient_magnitude(x, backend="reference")

        def check(where):
            y = tf.gradient_magnitude(x)
            assert torch.allclose(y, want, rtol=1e-6, atol=1e-6)
            print(where, "ok", flush=True)

        atexit.register(check, "atexit")

        def late():
            time.sleep(1.0)  # the main thread has returned by now
            check("thread")

        threading.Thread(target=late).start()
    """, OMP_NUM_THREADS="2", TORCHFILTERS_COMPILE=compile_mode)
    assert rc == 0, err
    assert "thread ok" in out and "atexit ok" in out, (out, err)
