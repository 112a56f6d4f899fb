"""numba primitives of the CPU engine: raw pointers, dtype bit casts and conversions,
prefetch, non-temporal (streaming) stores, and the storage carriers that select a
kernel's dtype specialisation.

Compiled code is cached on disk (``cache=True``; numba uses a user-wide cache
directory when the package directory is read-only, or ``NUMBA_CACHE_DIR``).
Kernels: filter forward/backward per epilogue (stack, magnitude, direction),
blur forward/backward, and the direct kernels per (stencil forms, epilogue),
each compiled lazily once per storage dtype.
"""

from __future__ import annotations


import math

import numpy as np
import torch
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic, overload


from .._tiered import CPU_DTYPES as _DTYPES  # (one list: dispatch reads it before numba loads)

# storage carriers: the type of the scalar selects the compiled specialisation
# (float16 is read as uint16 bits, bfloat16 as int16 bits)
_CARRIER = {
    torch.float32: np.float32(0),
    torch.float64: np.float64(0),
    torch.float16: np.uint16(0),
    torch.bfloat16: np.int16(0),
}
_NP_STORAGE = {torch.float32: np.float32, torch.float64: np.float64, torch.float16: np.float16, torch.bfloat16: np.int16,
               torch.uint8: np.uint8, torch.bool: np.bool_}  # (uint8, bool: the Canny maps)

#: ``no_cfunc_wrapper``: nothing calls a kernel or helper through a C function pointer, and numba
#: otherwise builds and compiles a C wrapper for each, the helpers that every kernel inlines
#: included (a direct 3x3 magnitude kernel: 33 of them, 5.9 -> 5.0 s to compile)
_JIT = dict(cache=True, nogil=True, fastmath=False, error_model="numpy", no_cfunc_wrapper=True)
#: the ``@overload`` implementations' options (helpers too); ``_OVL_LITERAL`` for those that
#: specialise on literal codes (closures: not cached on disk, the kernels that inline them are)
_OVL = dict(cache=True, no_cfunc_wrapper=True)
_OVL_LITERAL = dict(no_cfunc_wrapper=True)


# =============================================================================
# numba primitives: raw pointers, dtype conversion


@intrinsic
def _ptr(typingctx, addr, carrier):
    """``int`` address -> ``CPointer(typeof(carrier))`` (no bounds or wraparound checks)."""
    ptype = types.CPointer(carrier)
    sig = ptype(types.int64, carrier)

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], context.get_value_type(ptype))

    return sig, codegen


@intrinsic
def _bits2f(typingctx, v):
    sig = types.float32(types.uint32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())

    return sig, codegen


@intrinsic
def _f2bits(typingctx, v):
    sig = types.uint32(types.float32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))

    return sig, codegen


def _exponent_mask(v):
    """(LLVM integer type, numba unsigned type, exponent mask) of float32/float64 ``v``."""
    w = v.bitwidth
    return ir.IntType(w), (types.uint32 if w == 32 else types.uint64), (0x7F800000 if w == 32 else 0x7FF0000000000000)


@intrinsic
def _expo(typingctx, v):
    """The exponent bits of a float32/float64 ``v`` as an unsigned integer of its width: equal to
    ``_expo_all(v)`` exactly when ``v`` is inf or NaN (integer max-reductions vectorise)."""
    it, ut, mask = _exponent_mask(v)

    def codegen(context, builder, signature, args):
        return builder.and_(builder.bitcast(args[0], it), ir.Constant(it, mask))

    return ut(v), codegen


@intrinsic
def _expo_all(typingctx, v):
    """The all-ones exponent of ``v``'s float type (``_expo`` of inf and NaN)."""
    it, ut, mask = _exponent_mask(v)

    def codegen(context, builder, signature, args):
        return ir.Constant(it, mask)

    return ut(v), codegen


@intrinsic
def _sel(typingctx, c, a, b):
    """``a if c else b`` as one LLVM ``select`` (no branch: it vectorises)."""
    sig = a(types.boolean, a, a)

    def codegen(context, builder, signature, args):
        cond = context.cast(builder, args[0], signature.args[0], types.boolean)
        return builder.select(cond, args[1], args[2])

    return sig, codegen


@njit(inline="always", **_JIT)
def _mag_flag(s, nz):
    """``_expo_all(s)`` where ``sqrt(s)`` (``s`` a sum of squares) is not the magnitude -- ``s``
    overflowed (or is NaN), or underflowed to 0 or a subnormal while a component is not 0
    (``nz``) -- else at most ``s``'s exponent bits: an integer max-reduction of it vectorises,
    the rescaled pixels (:func:`_hyp2`) are redone after the loop when it reaches ``_expo_all``."""
    e = _expo(s)
    return _sel((e == 0) & nz, _expo_all(s), e)


@njit(**_JIT)
def _hyp2(a, b):
    """``sqrt(a*a + b*b)``, and where that over/underflows ``m * sqrt((a/m)**2 + (b/m)**2)``,
    ``m = max(|a|, |b|)`` (the reference's formula: ``reference._scaled``)."""
    s = a * a + b * b
    e = _expo(s)
    if not ((e == _expo_all(s) and s == s) or (e == 0 and (a != 0 or b != 0))):
        return math.sqrt(s)
    m = max(abs(a), abs(b))
    if m == np.inf:
        return m
    ta = a / m
    tb = b / m
    return m * math.sqrt(ta * ta + tb * tb)


@njit(**_JIT)
def _hyp2_vjp(g, a, b):
    """``(g*a/|y|, g*b/|y|)`` for a rescaled pixel (:func:`_hyp2`): ``g * (a/m) / sqrt(...)``."""
    m = max(abs(a), abs(b))
    ta = a / m
    tb = b / m
    sc = g / math.sqrt(ta * ta + tb * tb)
    return sc * ta, sc * tb


@njit(**_JIT)
def _h2f(h):
    """float16 bits -> float32, exact (integer arithmetic: no LLVM half type, whose
    conversions can lower to compiler-rt calls the JIT cannot resolve)."""
    u = np.uint32(h)
    o = (u & np.uint32(0x7FFF)) << np.uint32(13)
    e = o & np.uint32(0x0F800000)
    o += np.uint32(112 << 23)
    if e == np.uint32(0x0F800000):  # inf / nan
        o += np.uint32(112 << 23)
    elif e == np.uint32(0):  # zero / subnormal: renormalise through the FPU
        o = _f2bits(_bits2f(o + np.uint32(1 << 23)) - _bits2f(np.uint32(113 << 23)))
    return _bits2f(o | ((u & np.uint32(0x8000)) << np.uint32(16)))


@njit(**_JIT)
def _f2h(f):
    """float32 -> float16 bits, round to nearest even (F. Giesen's float_to_half_fast3_rtne)."""
    x = _f2bits(f)
    sign = x & np.uint32(0x80000000)
    x ^= sign
    if x >= np.uint32(143 << 23):  # inf, nan, or too large
        o = np.uint32(0x7E00) if x > np.uint32(0x7F800000) else np.uint32(0x7C00)
    elif x < np.uint32(113 << 23):  # subnormal or zero
        o = _f2bits(_bits2f(x) + _bits2f(np.uint32(126 << 23))) - np.uint32(126 << 23)
    else:
        o = (x + np.uint32(((15 - 127) << 23) + 0xFFF) + ((x >> np.uint32(13)) & np.uint32(1))) >> np.uint32(13)
    return np.uint16(o | (sign >> np.uint32(16)))


def _prefetcher(rw):
    @intrinsic
    def prefetch(typingctx, ptr, idx):
        """Hint the cache to fetch ``ptr[idx]`` (``llvm.prefetch``; rw=1: for writing)."""
        sig = types.void(ptr, types.int64)

        def codegen(context, builder, signature, args):
            p, i = args
            addr = builder.bitcast(builder.gep(p, [i]), ir.IntType(8).as_pointer())
            i32 = ir.IntType(32)
            fnty = ir.FunctionType(ir.VoidType(), [ir.IntType(8).as_pointer(), i32, i32, i32])
            fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0")
            builder.call(fn, [addr, ir.Constant(i32, rw), ir.Constant(i32, 3), ir.Constant(i32, 1)])
            return context.get_dummy_value()

        return sig, codegen

    return prefetch


_prefetch_r = _prefetcher(0)
_prefetch_w = _prefetcher(1)


@intrinsic
def _stream_line(typingctx, dst, di, src, si):
    """Copy the 64 bytes at ``src + si`` to ``dst + di`` (elements of the pointers' type; both
    64-byte aligned) with a non-temporal store: the line goes to memory without being read
    for ownership first and without evicting the cache's contents (``_fence`` orders it)."""
    sig = types.void(dst, types.int64, src, types.int64)

    def codegen(context, builder, signature, args):
        d, di, s, si = args
        vt = ir.VectorType(ir.IntType(64), 8)
        v = builder.load(builder.bitcast(builder.gep(s, [si]), vt.as_pointer()), align=64)
        st = builder.store(v, builder.bitcast(builder.gep(d, [di]), vt.as_pointer()), align=64)
        st.set_metadata("nontemporal", builder.module.add_metadata([ir.Constant(ir.IntType(32), 1)]))
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def _fence(typingctx):
    """A full memory fence (``mfence`` on x86): orders the non-temporal stores before it."""

    def codegen(context, builder, signature, args):
        builder.fence("seq_cst")
        return context.get_dummy_value()

    return types.void(), codegen


def _ld(p, i):  # pragma: no cover - numba overload below
    raise NotImplementedError


def _st(p, i, v):  # pragma: no cover
    raise NotImplementedError


def _line(p):  # pragma: no cover
    raise NotImplementedError


@overload(_line, jit_options=_OVL)
def _ol_line(p):
    """Elements of ``p``'s type in a 64-byte cache line."""
    n = 64 // p.dtype.bitwidth * 8
    return lambda p: n


def _cvt(carrier, F):  # pragma: no cover
    raise NotImplementedError


@overload(_ld, jit_options=_OVL)
def _ol_ld(p, i):
    dt = p.dtype
    if dt in (types.float32, types.float64):
        return lambda p, i: p[i]
    if dt == types.uint16:  # float16 bits
        return lambda p, i: _h2f(p[i])
    if dt == types.int16:  # bfloat16 bits
        return lambda p, i: _bits2f(np.uint32(np.uint16(p[i])) << np.uint32(16))
    return None


@overload(_st, jit_options=_OVL)
def _ol_st(p, i, v):
    dt = p.dtype
    if dt == types.float32:

        def st32(p, i, v):
            p[i] = np.float32(v)

        return st32
    if dt == types.float64:

        def st64(p, i, v):
            p[i] = v

        return st64
    if dt == types.uint16:

        def sth(p, i, v):
            p[i] = _f2h(np.float32(v))

        return sth
    if dt == types.int16:

        def stb(p, i, v):
            u = _f2bits(np.float32(v))
            if (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000):
                p[i] = np.int16(0x7FC0)  # quiet NaN
            else:  # round to nearest even, as torch
                p[i] = np.int16(np.uint16((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)))

        return stb
    return None


@overload(_cvt, jit_options=_OVL)
def _ol_cvt(carrier, F):
    """Compute-dtype copy of ``F``: float64 for float64 storage, else float32."""
    if carrier == types.float64:
        return lambda carrier, F: F.copy()
    return lambda carrier, F: F.astype(np.float32)
