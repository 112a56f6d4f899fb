"""Explicit SIMD vectors for the separable path: a numba type for an LLVM vector of the
compute dtype (float32 or float64) and the few operations the 1-D passes need.

numba's loop vectoriser handles one output row at a time and gives up (or adds runtime alias
checks) once a loop reads more than a few independent streams; a register-blocked pass reads
a dozen rows at once and keeps its accumulators in registers across a run-time tap loop.
Writing the vectors explicitly makes that code independent of the vectoriser's heuristics.

One vector is the widest register of the CPU numba compiles for (:func:`_target`: the host,
or ``NUMBA_CPU_NAME`` / ``NUMBA_CPU_FEATURES``): 64 bytes with AVX-512, 32 with AVX, else 16
(float32: 16, 8 or 4 lanes).  Wider logical vectors would only be split by LLVM, narrower ones
waste half the machine.  numba's disk cache keys compiled code on that target CPU, so a cache
never crosses machines with a different width.

Operations: ``_vld`` / ``_vst`` (unaligned load/store), ``_vstnt`` (a non-temporal line store),
``_vldm`` / ``_vstm`` (the first ``n``
lanes, masked: tails never touch memory past them), built on ``_load_masked`` /
``_store_masked`` (any lane mask; without AVX-512, a plain access where every lane is wanted:
``CHEAP_MASKS``), ``_vsplat`` (broadcast ``p[i]``),
``_vadd``, ``_vmul``, ``_vfma`` (``a*b + c`` through ``llvm.fmuladd``: one rounding where the
host has FMA, as every AVX2 and AVX-512 machine does), ``_vnz`` (``-0.0``), ``_vrev`` (lanes reversed),
``_vwts`` (a block of broadcast weights), ``_vmaxabs`` / ``_vmagodd`` / ``_vmagbad`` (the
magnitude's rescaling test, ``reference._rescale``) and ``_vtaps2`` (a block of horizontal taps for two output vectors, its left windows taken
from registers by constant shuffles).
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic, models, register_model


def _target() -> tuple[str, dict]:
    """The CPU numba compiles for and its features (``{name: bool}``): ``NUMBA_CPU_NAME`` /
    ``NUMBA_CPU_FEATURES`` where set (a cache built for other machines), else the host's -- as
    numba's own codegen chooses them.  Every choice below follows it, never the host alone: an
    instruction the target lacks must not be written in."""
    try:
        import llvmlite.binding as ll
        from numba.core import codegen, config

        name = config.CPU_NAME or ll.get_host_cpu_name()
        # (numba's host features honour NUMBA_ENABLE_AVX=0; later flags override earlier ones)
        flags = config.CPU_FEATURES if config.CPU_FEATURES is not None else codegen.get_host_cpu_features()
        feats = {}
        for f in flags.split(","):
            f = f.strip()
            if len(f) > 1 and f[0] in "+-":
                feats[f[1:]] = f[0] == "+"
        # each level only on the one below it (LLVM's ``-avx`` turns off AVX2 and AVX-512 too)
        feats["avx"] = bool(feats.get("avx"))
        feats["avx2"] = feats["avx"] and bool(feats.get("avx2"))
        feats["avx512f"] = feats["avx2"] and bool(feats.get("avx512f"))
        return name, feats
    except Exception:  # pragma: no cover - exotic hosts: SSE/NEON-sized vectors
        return "", {}


_CPU, _FEATURES = _target()


def _vector_bytes() -> int:
    if _FEATURES.get("avx512f"):
        return 64
    if _FEATURES.get("avx2") or _FEATURES.get("avx"):
        return 32
    return 16


VBYTES = _vector_bytes()
#: whether masked loads and stores cost what plain ones do (AVX-512's mask registers).  Without
#: AVX-512 they are ``vmaskmov``, whose store is microcoded on AMD's Zen cores (the 3-D Sobel
#: ran 2x slower through it on every vector of a Zen 1 host): there ``_vldm`` / ``_vstm`` take a
#: plain load or store where all lanes are wanted, and mask only a tail
CHEAP_MASKS = VBYTES == 64
#: whether the target's vector units are 128 bits wide, splitting each 256-bit operation in two
#: (AMD's Zen 1 and its Bulldozer forerunners): a shuffle across the halves of a
#: vector is several micro-ops there, so ``_vtaps2`` takes its left windows by unaligned loads
#: rather than by shuffles of the vectors it holds (Gaussian passes 8-15% faster on a Zen 1
#: host), and ``_vleft`` / ``_vright`` go through ``_shift_across`` (the 3-D Sobel 11% faster:
#: benchmarks/RESULTS-cpu.md).  Read when a kernel compiles; numba's disk cache keys on
#: the target CPU (:func:`_target`), so a cache never carries one choice to a CPU that wants the other.
#: (AVX2 for ``_shift_across``'s ``vpalignr``: the AVX-only Bulldozers and Jaguar keep the shuffles)
_AVX2 = bool(_FEATURES.get("avx2"))
SPLIT_HALVES = VBYTES == 32 and _AVX2 and _CPU in ("znver1", "bdver4")


def lanes(dtype) -> int:
    """Lanes of one vector of ``dtype`` (a numba float type)."""
    return VBYTES // (dtype.bitwidth // 8)


class Vec(types.Type):
    """A SIMD register of ``lanes`` values of ``dtype`` (float32 or float64)."""

    def __init__(self, dtype):
        self.dtype = dtype
        self.lanes = lanes(dtype)
        super().__init__(name=f"Vec({dtype}x{self.lanes})")


@register_model(Vec)
class _VecModel(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        be = ir.VectorType(dmm.lookup(fe_type.dtype).get_value_type(), fe_type.lanes)
        super().__init__(dmm, fe_type, be)


def _vptr(builder, p, i, vt):
    return builder.bitcast(builder.gep(p, [i]), vt.as_pointer())


def _esize(vt):
    """Element size in bytes (the alignment the loads and stores assume)."""
    return 4 if isinstance(vt.element, ir.FloatType) else 8


def _sfx(vt):
    return f"v{vt.count}{'f32' if isinstance(vt.element, ir.FloatType) else 'f64'}"


def _lane_mask(builder, n, count):
    """``<count x i1>``: lane < n."""
    i64v = ir.VectorType(ir.IntType(64), count)
    iota = ir.Constant(i64v, list(range(count)))
    nv = builder.insert_element(ir.Constant(i64v, ir.Undefined), n, ir.Constant(ir.IntType(32), 0))
    nv = builder.shuffle_vector(nv, nv, ir.Constant(ir.VectorType(ir.IntType(32), count), [0] * count))
    return builder.icmp_signed("<", iota, nv)


def _all_lanes(builder, n, vt):
    """``n >= lanes``: a masked access of ``n`` lanes wants every lane of ``vt``."""
    return builder.icmp_signed(">=", n, ir.Constant(n.type, vt.count))


def _splat(builder, s, vt):
    v = builder.insert_element(ir.Constant(vt, ir.Undefined), s, ir.Constant(ir.IntType(32), 0))
    return builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(ir.IntType(32), vt.count), [0] * vt.count))


def _masked(builder, vt, name):
    """``llvm.masked.load`` / ``llvm.masked.store`` (``name``) of vectors ``vt``."""
    mt = ir.VectorType(ir.IntType(1), vt.count)
    if name == "load":
        fnty = ir.FunctionType(vt, [vt.as_pointer(), ir.IntType(32), mt, vt])
    else:
        fnty = ir.FunctionType(ir.VoidType(), [vt, vt.as_pointer(), ir.IntType(32), mt])
    return cgutils.get_or_insert_function(builder.module, fnty, f"llvm.masked.{name}.{_sfx(vt)}.p0")


def _get(x):
    return x() if callable(x) else x


def _load_masked(builder, ptr, vt, mask, whole):
    """``vt`` at ``ptr`` in the lanes ``mask`` sets, 0 in the others, whose memory is not read.

    ``mask`` is a ``<lanes x i1>`` and ``whole`` an ``i1`` saying that every lane is wanted;
    either may be a function that builds it. Without AVX-512 (``CHEAP_MASKS`` false) a masked
    access is ``vmaskmov``, slow on AMD's Zen cores, so there a ``whole`` access is a plain load
    and only the other branch is masked.
    """
    def masked():
        return builder.call(_masked(builder, vt, "load"),
                            [ptr, ir.Constant(ir.IntType(32), _esize(vt)), _get(mask), ir.Constant(vt, None)])

    if CHEAP_MASKS:
        return masked()
    with builder.if_else(_get(whole), likely=True) as (then, other):
        with then:
            a, ba = builder.load(ptr, align=_esize(vt)), builder.basic_block
        with other:
            b, bb = masked(), builder.basic_block
    v = builder.phi(vt)
    v.add_incoming(a, ba)
    v.add_incoming(b, bb)
    return v


def _store_masked(builder, v, ptr, mask, whole):
    """Store ``v`` at ``ptr`` in the lanes ``mask`` sets (memory under the others is not
    written); ``mask`` and ``whole`` as for :func:`_load_masked`."""
    def masked():
        builder.call(_masked(builder, v.type, "store"), [v, ptr, ir.Constant(ir.IntType(32), _esize(v.type)), _get(mask)])

    if CHEAP_MASKS:
        masked()
        return
    with builder.if_else(_get(whole), likely=True) as (then, other):
        with then:
            builder.store(v, ptr, align=_esize(v.type))
        with other:
            masked()


def _fmuladd(builder, a, b, c):
    vt = a.type
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vt, [vt, vt, vt]), f"llvm.fmuladd.{_sfx(vt)}")
    return builder.call(fn, [a, b, c])


def _check_ptr(p):
    if not isinstance(p, types.CPointer) or p.dtype not in (types.float32, types.float64):
        raise TypeError(f"a float32/float64 pointer is needed, got {p}")


@intrinsic
def _vld(typingctx, p, i):
    """``p[i : i + lanes]``."""
    _check_ptr(p)
    VT = Vec(p.dtype)

    def codegen(context, builder, sig, args):
        vt = context.get_value_type(VT)
        return builder.load(_vptr(builder, args[0], args[1], vt), align=_esize(vt))

    return VT(p, i), codegen


@intrinsic
def _vldm(typingctx, p, i, n):
    """The first ``n`` lanes of ``p[i : i + lanes]`` (the others 0; memory past them is not read)."""
    _check_ptr(p)
    VT = Vec(p.dtype)

    def codegen(context, builder, sig, args):
        vt = context.get_value_type(VT)
        n = args[2]
        return _load_masked(builder, _vptr(builder, args[0], args[1], vt), vt,
                            lambda: _lane_mask(builder, n, vt.count), lambda: _all_lanes(builder, n, vt))

    return VT(p, i, n), codegen


@intrinsic
def _vst(typingctx, p, i, v):
    """``p[i : i + lanes] = v``."""
    _check_ptr(p)

    def codegen(context, builder, sig, args):
        vt = args[2].type
        builder.store(args[2], _vptr(builder, args[0], args[1], vt), align=_esize(vt))
        return context.get_dummy_value()

    return types.void(p, i, v), codegen


@intrinsic
def _vstnt(typingctx, p, i, v):
    """``p[i : i + lanes] = v`` with a non-temporal store (``p + i`` 64-byte aligned, the vector
    a whole cache line): the line goes to memory without being read first (``prims._fence``
    orders it)."""
    _check_ptr(p)

    def codegen(context, builder, sig, args):
        vt = args[2].type
        st = builder.store(args[2], _vptr(builder, args[0], args[1], vt), align=64)
        st.set_metadata("nontemporal", builder.module.add_metadata([ir.Constant(ir.IntType(32), 1)]))
        return context.get_dummy_value()

    return types.void(p, i, v), codegen


@intrinsic
def _vstm(typingctx, p, i, v, n):
    """``p[i : i + n] = v[:n]`` (memory past them is not written)."""
    _check_ptr(p)

    def codegen(context, builder, sig, args):
        vt = args[2].type
        n = args[3]
        _store_masked(builder, args[2], _vptr(builder, args[0], args[1], vt),
                      lambda: _lane_mask(builder, n, vt.count), lambda: _all_lanes(builder, n, vt))
        return context.get_dummy_value()

    return types.void(p, i, v, n), codegen


@intrinsic
def _vsplat(typingctx, p, i):
    """``p[i]`` in every lane."""
    _check_ptr(p)
    VT = Vec(p.dtype)

    def codegen(context, builder, sig, args):
        vt = context.get_value_type(VT)
        return _splat(builder, builder.load(builder.gep(args[0], [args[1]])), vt)

    return VT(p, i), codegen


@intrinsic
def _vnz(typingctx, p):
    """A vector of ``-0.0`` of ``p``'s element type: the exact additive identity (``x + -0.0``
    is ``x``, the sign of a zero included)."""
    _check_ptr(p)
    VT = Vec(p.dtype)

    def codegen(context, builder, sig, args):
        vt = context.get_value_type(VT)
        return ir.Constant(vt, [ir.Constant(vt.element, -0.0)] * vt.count)

    return VT(p), codegen


@intrinsic
def _vadd(typingctx, a, b):
    def codegen(context, builder, sig, args):
        return builder.fadd(args[0], args[1])

    return a(a, b), codegen


@intrinsic
def _vsub(typingctx, a, b):
    def codegen(context, builder, sig, args):
        return builder.fsub(args[0], args[1])

    return a(a, b), codegen


@intrinsic
def _vmul(typingctx, a, b):
    def codegen(context, builder, sig, args):
        return builder.fmul(args[0], args[1])

    return a(a, b), codegen


@intrinsic
def _vfma(typingctx, a, b, c):
    """``a*b + c`` (``llvm.fmuladd``: fused where the host has FMA)."""

    def codegen(context, builder, sig, args):
        return _fmuladd(builder, *args)

    return a(a, b, c), codegen


@intrinsic
def _vrev(typingctx, a):
    """The lanes of ``a`` in reverse order."""

    def codegen(context, builder, sig, args):
        n = args[0].type.count
        return builder.shuffle_vector(args[0], args[0], ir.Constant(ir.VectorType(ir.IntType(32), n),
                                                                    list(range(n - 1, -1, -1))))

    return a(a), codegen


def _shift_across(builder, a, b, left):
    """``_vleft(a, b)`` (``left``) or ``_vright(a, b)`` of two 256-bit vectors where the host
    splits them into 128-bit halves (``SPLIT_HALVES``; AVX2).  LLVM lowers those shuffles through
    ``vperm2f128`` (8 micro-ops on Zen 1); the pair ``[a.hi, b.lo]`` built by an extract and an
    insert (3), then one in-lane ``vpalignr``, gives the same lanes."""
    import llvmlite.binding as ll

    ll.initialize_native_asmparser()  # (inline assembly: LLVM parses it when it emits code)
    vt = a.type
    imm = _esize(vt) * (vt.count // 2 - 1) if left else _esize(vt)  # bytes: one element off the halves' ends
    # AT&T operand order; $0 the result (early clobber: written before the inputs are all read)
    asm = (f"vextractf128 $$1, $1, ${{0:x}}\n\tvinsertf128 $$1, ${{2:x}}, $0, $0\n\t"
           f"vpalignr $${imm}, {'$0, $2' if left else '$1, $0'}, $0")
    return builder.asm(ir.FunctionType(vt, [vt, vt]), asm, "=&x,x,x", [a, b], side_effect=False)


def _shift(builder, a, b, left):
    """``_vleft(a, b)`` (``left``) or ``_vright(a, b)``: a constant shuffle, or
    :func:`_shift_across` for 256-bit vectors where the target splits them (and has AVX2)."""
    n = a.type.count
    if SPLIT_HALVES and _AVX2 and n * _esize(a.type) == 32:
        return _shift_across(builder, a, b, left)
    first = n - 1 if left else 1
    return builder.shuffle_vector(a, b, ir.Constant(ir.VectorType(ir.IntType(32), n), list(range(first, first + n))))


@intrinsic
def _vleft(typingctx, a, b):
    """``[a[-1], b[0], .., b[-2]]``: each lane of ``b``'s left neighbour, for ``a`` the vector
    before it (a constant shuffle, no unaligned load)."""

    def codegen(context, builder, sig, args):
        return _shift(builder, args[0], args[1], left=True)

    return a(a, b), codegen


@intrinsic
def _vright(typingctx, b, c):
    """``[b[1], .., b[-1], c[0]]``: each lane of ``b``'s right neighbour, for ``c`` the vector
    after it."""

    def codegen(context, builder, sig, args):
        return _shift(builder, args[0], args[1], left=False)

    return b(b, c), codegen


@intrinsic
def _vwts(typingctx, w, k0):
    """``w[k0 + 1 .. k0 + lanes]``, each broadcast to a vector (a tuple: kept in registers
    across the rows of a horizontal pass)."""
    _check_ptr(w)
    VT = Vec(w.dtype)
    tup = types.UniTuple(VT, VT.lanes)

    def codegen(context, builder, sig, args):
        vt = context.get_value_type(VT)
        vals = [_splat(builder, builder.load(builder.gep(args[0], [builder.add(args[1], ir.Constant(args[1].type, t))])), vt)
                for t in range(1, vt.count + 1)]
        return context.make_tuple(builder, tup, vals)

    return tup(w, k0), codegen


@intrinsic
def _vtaps2(typingctx, a0, a1, b0, b1, A, B, C, s, q, WT, k0, r):
    """Horizontal taps ``k = min(k0+lanes, r) .. k0+1`` (descending: SciPy's order, the pairs from
    the outermost in) of two output vectors at ``s[q]`` and ``s[q + lanes]`` (symmetric:
    ``+= (s[j-k] + s[j+k]) * w[k]`` per lane ``j``, the product then the sum: no fused
    multiply-add; ``WT`` is ``_vwts(w, k0)``): returns ``(a0, a1, b0, b1)``, ``a0`` / ``b0`` the
    sums of the first / second vector (``a1``, ``b1`` pass through: ``-0.0`` from the caller).

    ``A, B, C`` are the vectors at ``s[q - k0 - lanes]``, ``s[q - k0]`` and ``s[q - k0 + lanes]``:
    each left window ``s[j-k ..]`` is a constant shuffle of two of them (no unaligned load);
    the right windows are loads.  Shuffles and loads use different execution ports, so
    splitting the taps between them roughly halves the cost of the pass -- except where
    256-bit vectors run as two halves (``SPLIT_HALVES``): there the left windows are loads
    too (the same sums, the same bits).  The taps are
    unrolled (the shuffle masks must be constants) in blocks entered by a ``switch`` at the
    first tap ``k <= r`` (falling through to the last): the tap count stays a run-time value."""
    _check_ptr(s)
    tup = types.UniTuple(a0, 4)

    def codegen(context, builder, sig, args):
        x0, x1, y0, y1, va, vb, vc, sp, qq, wt, kk0, rr = args
        vt = x0.type
        n = vt.count
        it = kk0.type
        i32v = ir.VectorType(ir.IntType(32), n)

        def windows(i):  # the two vectors at s[i] and s[i + lanes]
            return [builder.load(_vptr(builder, sp, j, vt), align=_esize(vt))
                    for j in (i, builder.add(i, ir.Constant(i.type, n)))]

        entry = builder.block
        # the first tap: t = min(n, r - k0) (k = k0 + t); none when that is <= 0
        avail = builder.sub(rr, kk0)
        first = builder.select(builder.icmp_signed("<", avail, ir.Constant(it, n)), avail, ir.Constant(it, n))
        blocks = [builder.append_basic_block(f"taps.{t}") for t in range(n, 0, -1)]
        exit_bb = builder.append_basic_block("taps.exit")
        sw = builder.switch(first, exit_bb)
        for t, bb in zip(range(n, 0, -1), blocks):
            sw.add_case(ir.Constant(it, t), bb)
        prev = None
        for t, bb in zip(range(n, 0, -1), blocks):
            builder.position_at_end(bb)
            pa, pb = builder.phi(vt), builder.phi(vt)
            pa.add_incoming(x0, entry)
            pb.add_incoming(y0, entry)
            if prev is not None:
                pa.add_incoming(prev[0], prev[2])
                pb.add_incoming(prev[1], prev[2])
            k = builder.add(kk0, ir.Constant(it, t))
            wk = builder.extract_value(wt, t - 1)
            mask = ir.Constant(i32v, list(range(n - t, 2 * n - t)))
            if SPLIT_HALVES:
                l0, l1 = windows(builder.sub(qq, k))
            else:
                l0 = builder.shuffle_vector(va, vb, mask)
                l1 = builder.shuffle_vector(vb, vc, mask)
            r0, r1 = windows(builder.add(qq, k))
            na = builder.fadd(pa, builder.fmul(builder.fadd(l0, r0), wk))
            nb = builder.fadd(pb, builder.fmul(builder.fadd(l1, r1), wk))
            prev = (na, nb, builder.block)
            builder.branch(blocks[n - t + 1] if t > 1 else exit_bb)
        builder.position_at_end(exit_bb)
        ea, eb = builder.phi(vt), builder.phi(vt)
        ea.add_incoming(x0, entry)
        eb.add_incoming(y0, entry)
        ea.add_incoming(prev[0], prev[2])
        eb.add_incoming(prev[1], prev[2])
        return context.make_tuple(builder, tup, [ea, x1, eb, y1])

    return tup(a0, a1, b0, b1, A, B, C, s, q, WT, k0, r), codegen


def _fconst(vt, x):
    return ir.Constant(vt, [ir.Constant(vt.element, float(x))] * vt.count)


def _any(builder, mask, count):
    """Whether a lane of ``<count x i1>`` is set."""
    bits = builder.bitcast(mask, ir.IntType(count))
    return builder.icmp_unsigned("!=", bits, ir.Constant(ir.IntType(count), 0))


def _tiny(vt):
    return 1.1754943508222875e-38 if isinstance(vt.element, ir.FloatType) else 2.2250738585072014e-308


@intrinsic
def _vmaxabs(typingctx, m, v):
    """Lane-wise ``max(m, |v|)`` (a NaN ``v`` leaves ``m``: the magnitude's scale, whose NaN
    pixels need no rescaling)."""

    def codegen(context, builder, sig, args):
        mv, vv = args
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vv.type, [vv.type]), f"llvm.fabs.{_sfx(vv.type)}")
        a = builder.call(fn, [vv])
        return builder.select(builder.fcmp_ordered(">", a, mv), a, mv)

    return m(m, v), codegen


@intrinsic
def _vmagodd(typingctx, s):
    """Whether a lane of a sum of squares ``s`` is below the smallest normal (0 included), inf
    or NaN: the cheap first test before :func:`_vmagbad`."""

    def codegen(context, builder, sig, args):
        sv = args[0]
        vt = sv.type
        odd = builder.or_(builder.fcmp_unordered("<", sv, _fconst(vt, _tiny(vt))),
                          builder.fcmp_ordered("==", sv, _fconst(vt, float("inf"))))
        return _any(builder, odd, vt.count)

    return types.boolean(s), codegen


@intrinsic
def _vmagbad(typingctx, s, m):
    """Whether a lane of the sum of squares ``s`` needs the rescaled magnitude
    (``reference._rescale``): ``s`` is inf, or below the smallest normal while a component is
    not 0 (``m = max |y_k| > 0``); never for NaN."""

    def codegen(context, builder, sig, args):
        sv, mv = args
        vt = sv.type
        small = builder.and_(builder.fcmp_ordered("<", sv, _fconst(vt, _tiny(vt))),
                             builder.fcmp_ordered(">", mv, ir.Constant(vt, None)))
        bad = builder.or_(builder.fcmp_ordered("==", sv, _fconst(vt, float("inf"))), small)
        return _any(builder, bad, vt.count)

    return types.boolean(s, m), codegen
