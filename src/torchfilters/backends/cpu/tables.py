"""The layout of the plan arrays the kernels read: ``P`` (int64: sizes, fold tables,
tap offsets, stencil descriptors, border-column lists), ``F`` (float64: ``cval``,
tap weights, constant-mode corrections) and the per-call layout ``L`` (where each
plane of each tensor starts).
"""

from __future__ import annotations


from numba import njit

from .prims import _JIT

# =============================================================================
# plan layout (int64 array P; float64 array F)

I_H, I_W, I_K, I_EPI, I_CONST = 0, 1, 2, 3, 4
I_EYLO, I_EYHI, I_EXLO, I_EXHI = 5, 6, 7, 8
I_FH, I_FW, I_ST, I_TAPI = 9, 10, 11, 12
I_KEEPB, I_BI0, I_BI1, I_BJ0, I_BJ1 = 13, 14, 15, 16, 17
I_BR, I_NB, I_NPM, I_NBX, I_BX = 18, 19, 20, 21, 22
I_PAD, I_CW, I_NC, I_MP = 23, 24, 25, 26
I_HDR = 32
# per stencil: nV, v0, nH, h0 (two-phase: vertical then horizontal taps), nD, d0
# (one-phase taps), corr kind (0 / 1 per column / 2 per row), corr offset in F,
# number and offset of the forward border columns, and the number of non-zero
# taps of each list (they come first; the adjoint uses only those); then the forward's
# 1-D passes in the spec's order, each summed in SciPy's order (``_lowering.pass_kind``):
# their number (0: the forward runs the lists above -- dense stencils, the identity), and per
# pass its axis (-2 / -1), kind (1 symmetric, -1 antisymmetric, 0 general), number of taps and
# first tap (a list of its own: the centre, then each pair left, right from the outermost in;
# or the last tap, then the others in order)
ST_LEN = 22
ST_NPH = 13

# F: [cval, 0, 1, threshold (set per call), taps..., corrections...]
F_CVAL, F_ZERO, F_ONE, F_THR, F_TAPS = 0, 1, 2, 3, 4

EPI_STACK, EPI_MAG, EPI_DIR, EPI_BLEND, EPI_NORM, EPI_SUM = 0, 1, 2, 3, 4, 5

# L (per-call layout): per role [n1, s0, s1, sK, sH, sW]; plane p starts at
# (p // n1) * s0 + (p % n1) * s1 elements from the tensor's data pointer
R_X, R_O, R_G, R_M = 0, 6, 12, 18
L_N = 24  # number of planes
L_LEN = 25

# Buffers are flat with row stride W (no column padding), so every loop runs
# over whole blocks of rows; taps that reach across the left/right edge read a
# neighbouring row there, and those few border columns are recomputed with the
# fold table ("fix-up" columns).  A guard of ex = EXhi - EXlo elements on each
# side keeps every flat read in bounds.


@njit(**_JIT)
def _poff(L, r, p):
    n1 = L[r]
    return (p // n1) * L[r + 1] + (p % n1) * L[r + 2]
