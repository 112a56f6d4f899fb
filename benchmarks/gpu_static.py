"""Static performance model of the Triton engine on an H200, without a GPU.

Usage::

    python benchmarks/gpu_static.py [--case NAME ...] [--list] [--json FILE] [--sass KERNEL]

Capture
-------
A stand-in Triton driver (:class:`StandInDriver`, a duck-typed ``CudaDriver``) is made active
with ``triton.runtime.driver.set_active``.  Its target is ``GPUTarget("cuda", 90, 32)``, its
``utils.load_binary`` returns dummy handles (``n_regs`` from ``cuobjdump --dump-resource-usage``
of the cubin) and its ``launcher_cls`` returns a recorder that stores ``(compiled kernel, grid,
args)`` instead of launching.  So a public call such as ``tf.gaussian_filter(x, 2.0,
backend="triton")`` runs its host code unchanged and every ``kernel[grid](...)`` goes through
Triton's own ``JITFunction.run``: the real specialisation (ints equal to 1 become constants,
ints and pointers divisible by 16 are marked aligned), the real compiler, the real cache.
Nothing here knows the engine's kernel names or modules: whatever a call launches is captured.

The arguments are CPU tensors (``torch.empty``: their data pointers are 16-byte aligned, as CUDA
allocations are).  The engine refuses CPU tensors unless Triton runs in interpreter mode, so the
ONE patch is: every module attribute named ``available`` in ``torchfilters.backends.triton*``
(modules or packages) is replaced by a predicate that accepts floating dtypes on any device.
``TRITON_INTERPRET`` must be unset (the script refuses to run otherwise).  Nothing executes, so
every value computed is garbage (a data-dependent loop on the host, e.g. Canny's hysteresis,
stops after its first check); only the launches matter.  The engine's ``FALLBACKS`` counters are
read before and after each case: a case that fell back to the reference engine (or launched no
kernel) is reported as ``fallback / no kernel``, never modelled.

Reading the SASS (``gpu_static_sass``)
--------------------------------------
``nvdisasm -c -g`` (shipped in ``triton/backends/nvidia/bin``) of ``k.asm["cubin"]``; basic
blocks and backward branches (loops).  *Executed warp-instructions per program* = sum over
blocks of (instructions in the block x its weight) x warps per program; predicated
instructions count (they issue).  A block's weight is the product of the trip counts of its
enclosing loops.  Trip counts: a loop whose latch compares a counter with an immediate, the
counter stepped by an immediate and initialised by an immediate before the loop, is counted
exactly (simulated; a 64-bit counter's high word is taken as 0); a loop whose source line is
``for v in range(a, b, s)`` with bounds from literals / the launch's scalar and constexpr
arguments is counted from those values; any other loop gets its count from ``TRIP_COUNTS`` (source-text pattern -> count),
else ``DEFAULT_TRIP`` and the row is flagged ``loop?``.  Calls: a call of a compiler-internal
subroutine on the slow side of a fast / slow split (64-bit division with a 32-bit fast path,
``sqrt_rn`` / ``div_rn`` of tiny / huge operands) is not taken; any other call (e.g. a 64-bit
``%`` with no fast path) is executed: the code after it keeps its weight and the callee's
instructions up to its ``RET`` (with their loops) are counted once per call.  Branches:
branches whose source line matches ``RARE_BRANCHES`` (the block-uniform overflow rescue
``if _any(bad)``) are not taken; every other conditional branch counts BOTH sides (an upper
bound; the number of such branches is printed).

L1 sectors
----------
Each global load / store in the SASS is matched, by source line, to the ``tt.load`` /
``tt.store`` of the compiled TTGIR at that line (several at one line: the average of their
patterns), which gives its distributed layout (``#ttg.blocked<{sizePerThread, threadsPerWarp, warpsPerCTA, order}>``) and element type; the
SASS opcode gives the bytes per lane (``.128`` = 16, ``.64`` = 8, else 4 / 2 / 1).  A request's
lanes then hold ``v = bytes / elem`` consecutive elements of their thread's run along the
layout's fastest dim; the tile's dims are taken to be the trailing dims of the case's input
(contiguous, row-major; lanes past the input's extent are masked, i.e. a tile at the origin).
Sectors = distinct 32-byte sectors the active lanes touch, averaged over the runs of a thread
and, for scalar (32-bit or narrower) requests, over every element offset within a sector (a
shifted stencil tap has unknown alignment; vector requests are taken as aligned).  A
tensor-less (uniform) load is one sector.  Shared-memory instructions are counted and charged
``ceil(32 x bytes / 128)`` wavefronts each (conflict-free).

The model (H200)
----------------
* DRAM time = ideal bytes (each input read once, each output written once; forward+backward
  cases: the ideal of both passes) / 4.1 TB/s (the copy bandwidth);
* issue time = warp-instructions / (132 SMs x 4 per clock x 1.98 GHz);
* L1 time = (sectors x 32 B + shared wavefronts x 128 B) / (128 B per clock x 132 x 1.98 GHz);
* estimate (% of copy bandwidth) = DRAM time / max(issue, L1, DRAM);
* occupancy from registers (65536 per SM, allocated per warp in units of 256), shared memory
  (228 KB per SM, 1 KB reserved per block), 64 warps and 32 blocks per SM; below 25% it is
  flagged ``LOW`` (latency risk) but not folded into the estimate.

These are MODEL figures: no latency, no L2, no tail effects, no DRAM inefficiency beyond the
copy bandwidth.  They show which limit (issue / L1 / DRAM) a kernel hits and by how much.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import dataclasses
import functools
import importlib
import json
import math
import os
import pkgutil
import re
import subprocess
import sys
import tempfile
import time
import typing

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu_static_sass as S

SMS, ISSUE, CLOCK, L1_BYTES, DRAM_BW = 132, 4, 1.98e9, 128, 4.1e12
REGS_SM, SMEM_SM, WARPS_SM, BLOCKS_SM = 65536, 228 * 1024, 64, 32
LOW_OCCUPANCY = 0.25

#: source-line text of branches a typical (interior, finite) program does not take
RARE_BRANCHES = ("if _any(",)
#: trip counts for loops the SASS does not bound: (pattern in the loop's source line, count)
TRIP_COUNTS: list = []
DEFAULT_TRIP = 1


# =============================================================================
# the stand-in driver


class Launch(typing.NamedTuple):
    kernel: object  # triton CompiledKernel
    grid: tuple
    args: tuple


RECORD: list = []


def _tool(name):
    import triton

    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)


def _with_cubin(cubin: bytes, argv):
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
    try:
        return subprocess.run([*argv, f.name], capture_output=True, text=True, check=True).stdout
    finally:
        os.unlink(f.name)


def resource_usage(cubin: bytes) -> dict:
    out = _with_cubin(cubin, [_tool("cuobjdump"), "--dump-resource-usage"])
    return {k: int(v) for k, v in re.findall(r"\b(REG|SHARED|LOCAL|STACK):(\d+)", out)}


class _Utils:
    def load_binary(self, name, kernel, shared, device):
        return None, None, resource_usage(kernel).get("REG", 0), 0, 1024

    def get_device_properties(self, device):
        return {"max_shared_mem": 232448, "multiprocessor_count": SMS, "max_num_regs": REGS_SM,
                "warpSize": 32, "sm_clock_rate": int(CLOCK / 1e3), "mem_clock_rate": 0, "mem_bus_width": 0}


class _Recorder:
    def __init__(self, src, metadata):
        self.src, self.metadata = src, metadata

    def __call__(self, gx, gy, gz, stream, function, packed_metadata, launch_metadata, enter, exit_, *args):
        RECORD.append(Launch(None, (gx, gy, gz), args))


class StandInDriver:
    """Duck-typed ``triton.backends.nvidia.driver.CudaDriver`` for an sm_90 device that records
    launches instead of running them."""

    def __init__(self):
        from triton.backends.nvidia.driver import ty_to_cpp

        self.utils = _Utils()
        self.launcher_cls = _Recorder
        self.map_python_to_cpp_type = ty_to_cpp

    def get_current_target(self):
        from triton.backends.compiler import GPUTarget

        return GPUTarget("cuda", 90, 32)

    def get_current_device(self):
        return 0

    def set_current_device(self, device):
        pass

    def get_current_stream(self, device=None):
        return 0

    def get_device_capability(self, device=None):
        return (9, 0)

    def get_active_torch_device(self):
        import torch

        return torch.device("cpu")

    @staticmethod
    def is_active():
        return True


def _kernel_run_hook():
    """Wrap ``CompiledKernel.run`` so that the recorder learns which compiled kernel it ran."""
    from triton.compiler.compiler import CompiledKernel

    prop = CompiledKernel.run

    def run(self):
        inner = prop.fget(self)

        def call(*a):
            n = len(RECORD)
            inner(*a)
            if len(RECORD) > n:
                RECORD[-1] = RECORD[-1]._replace(kernel=self)

        return call

    CompiledKernel.run = property(run)


def _engine_modules():
    import torchfilters.backends as B

    for info in pkgutil.walk_packages(B.__path__, B.__name__ + "."):
        if info.name.rsplit(".", 1)[-1].startswith("triton"):
            try:
                yield importlib.import_module(info.name)
            except ImportError:
                continue


def install():
    """Make the stand-in driver active and let the engine accept CPU tensors (``available``)."""
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise SystemExit("gpu_static: unset TRITON_INTERPRET (the model compiles real sm_90 kernels)")
    import torch
    from triton.runtime import driver

    driver.set_active(StandInDriver())
    _kernel_run_hook()
    floats = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
    mods = list(_engine_modules())
    for m in mods:
        if callable(getattr(m, "available", None)):
            m.available = lambda device, dtype: dtype in floats
    return mods


def fallbacks(mods):
    """``{counter: count}`` over the engine modules' ``FALLBACKS`` (a counter shared by several
    modules counts once)."""
    tot, seen = {}, set()
    for m in mods:
        c = getattr(m, "FALLBACKS", None)
        if c is None or id(c) in seen:
            continue
        seen.add(id(c))
        for k, v in c.items():
            tot[f"{m.__name__.rsplit('.', 1)[-1]}.{k}"] = v
    return tot


# =============================================================================
# cases


@dataclasses.dataclass
class Case:
    name: str
    shape: tuple
    dtype: str
    op: object  # (torch module tf, x) -> output
    target: float
    backward: bool = False


def _cases():
    gm = lambda op, **kw: (lambda tf, x: tf.gradient_magnitude(x, operator=op, backend="triton", **kw))
    gauss = lambda **kw: (lambda tf, x: tf.gaussian_filter(x, 2.0, backend="triton", **kw))
    sb = lambda tf, x: tf.selective_blur(x, 0.0, backend="triton")
    ax3 = {"axes": (-3, -2, -1)}
    return [
        Case("gm_central_f32", (1000, 128, 28, 28), "float32", gm("central"), 80),
        Case("gm_central_bf16", (1000, 128, 28, 28), "bfloat16", gm("central"), 80),
        Case("sobel_f32", (1000, 128, 28, 28), "float32", gm("sobel"), 80),
        Case("sobel_bf16", (1000, 128, 28, 28), "bfloat16", gm("sobel"), 80),
        Case("gm_central_f32_fwdbwd", (1000, 128, 28, 28), "float32", gm("central"), 70, True),
        Case("selective_blur_f32", (64, 64, 64, 64), "float32", sb, 80),
        Case("selective_blur_f32_fwdbwd", (64, 64, 64, 64), "float32", sb, 70, True),
        Case("gaussian_f32_28", (200, 128, 28, 28), "float32", gauss(), 70),
        Case("gaussian_f32_4096", (1, 1, 4096, 4096), "float32", gauss(), 70),
        Case("sobel_f32_4096", (1, 1, 4096, 4096), "float32", gm("sobel"), 80),
        Case("sobel3d_f32", (2, 1, 128, 128, 128), "float32", gm("sobel", **ax3), 60),
        Case("gaussian3d_f32", (1, 1, 192, 192, 192), "float32", gauss(**ax3), 60),
        Case("median3_f32", (64, 3, 256, 256), "float32",
             lambda tf, x: tf.median_filter(x, size=3, backend="triton"), 0),
        Case("canny_f32", (16, 1, 512, 512), "float32", lambda tf, x: tf.canny(x, backend="triton"), 0),
    ]


CASES = _cases()


def _nbytes(t):
    import torch

    if isinstance(t, torch.Tensor):
        return t.numel() * t.element_size()
    if isinstance(t, (tuple, list)):
        return sum(_nbytes(v) for v in t)
    return 0


def capture(case, mods):
    """``(launches, ideal_bytes, outputs, error)`` of one case."""
    import torch

    import torchfilters.functional as tf

    dtype = getattr(torch, case.dtype)
    x = torch.empty(case.shape, dtype=dtype)
    before = fallbacks(mods)
    del RECORD[:]
    err = None
    try:
        if case.backward:
            xx = x.requires_grad_(True)
            y = case.op(tf, xx)
            g = torch.empty_like(y)
            (dx,) = torch.autograd.grad(y, xx, g)
            ideal = 2 * _nbytes(x) + _nbytes(y) + _nbytes(g) + _nbytes(dx)
            outs = _nbytes(y)
        else:
            with torch.no_grad():
                y = case.op(tf, x)
            ideal = _nbytes(x) + _nbytes(y)
            outs = _nbytes(y)
    except Exception as e:  # noqa: BLE001 -- reported, not fatal
        err = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
        ideal = outs = 0
    after = fallbacks(mods)
    fb = {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}
    if fb:
        err = "fallback / no kernel: " + ", ".join(f"{k}+{v}" for k, v in fb.items())
    return list(RECORD), ideal, outs, err


# =============================================================================
# per-kernel analysis


_LOC_DEF = re.compile(r"^#(loc\d*) = loc\((.*)\)\s*$", re.MULTILINE)
_OP = re.compile(r"\btt\.(load|store)\b(.*)loc\(#(loc\d*)\)\s*$", re.MULTILINE)
_ELEM = {"f32": 4, "f16": 2, "bf16": 2, "f64": 8, "i8": 1, "i1": 1, "i16": 2, "i32": 4, "i64": 8}


def _loc_table(ttgir):
    defs = dict(_LOC_DEF.findall(ttgir))

    @functools.lru_cache(None)
    def resolve(name):
        body = defs.get(name, "")
        m = re.match(r'"([^"]+)":(\d+):\d+', body)
        if m:
            return m.group(1), int(m.group(2))
        m = re.search(r"#(loc\d*)", body)  # name(#x), callsite(#callee at #caller), fused[#a, ...]
        return resolve(m.group(1)) if m and m.group(1) != name else ("", 0)

    return resolve


def mem_ops(ttgir):
    """``{(file, line): [(kind, layout or None, elem bytes)]}`` of the TTGIR loads / stores."""
    resolve = _loc_table(ttgir)
    layouts = S.blocked_layouts(ttgir)
    out = {}
    for kind, body, loc in _OP.findall(ttgir):
        m = re.search(r"tensor<[\dx]*x!tt\.ptr<(\w+)>,\s*#(\w+)>", body)
        if m:
            ent = (kind, layouts.get(m.group(2)), _ELEM.get(m.group(1), 4))
        else:
            m = re.search(r"!tt\.ptr<(\w+)>", body)
            ent = (kind, None, _ELEM.get(m.group(1), 4) if m else 4)
        out.setdefault(resolve(loc), []).append(ent)
    return out


@functools.lru_cache(None)
def _source(file):
    try:
        with open(file) as f:
            return f.read().splitlines()
    except OSError:
        return []


def src_line(file, n):
    lines = _source(file)
    return lines[n - 1] if 0 < n <= len(lines) else ""


_IMM = r"(0x[0-9a-f]+|\d+|RZ)"


def _imm(s):
    return 0 if s == "RZ" else int(s, 0)


_CMP = {"NE": lambda a, b: a != b, "EQ": lambda a, b: a == b, "LT": lambda a, b: a < b,
        "LE": lambda a, b: a <= b, "GT": lambda a, b: a > b, "GE": lambda a, b: a >= b}


def static_trip(bl, head, latch):
    """Trip count of a counted loop, or None.  The latch's branch predicate is set (directly or
    through a ``PLOP3`` of a uniform predicate) by an ``ISETP`` / ``UISETP`` comparing a register
    with an immediate; in the loop that register steps by an immediate (``IADD3`` / ``VIADD`` /
    ``UIADD3``); before it an immediate sets it.  The loop is then simulated."""
    lb = bl[latch]
    br = lb.instrs[-1]
    neg, p = br.pred.startswith("@!"), br.pred.lstrip("@!")
    body = [(s, j, i) for s, b in sorted(bl.items()) if head <= s <= latch for j, i in enumerate(b.instrs)]
    setter = None
    for _ in range(2):  # the predicate, then maybe the uniform predicate a PLOP3 copied
        setter = next((t for t in reversed(body) if t[2].rest.startswith(p + ",") and ".EX" not in t[2].op
                       and t[2].base in ("ISETP", "UISETP", "PLOP3")), None)  # .EX: a 64-bit high word
        if setter is None:
            return None
        if setter[2].base != "PLOP3":
            break
        ups = re.findall(r"\bUP\d\b", setter[2].rest)
        if len(ups) != 1:
            return None
        p = ups[0]
    ins = setter[2]
    m = re.match(rf"{p}, U?PT, (U?R\d+), {_IMM}, U?PT$", ins.rest)
    cond = next((c for c in ins.op.split(".")[1:] if c in _CMP), None)
    if ins.base == "PLOP3" or not m or cond is None:
        return None
    reg, bound = m.group(1), _imm(m.group(2))
    step, late = None, False  # late: the counter steps after the compare
    for s, j, i in body:
        mm = re.match(rf"{reg}, (?:U?P\d, )?{reg}, {_IMM}\b", i.rest)
        if i.base in ("IADD3", "VIADD", "UIADD3") and mm:
            if step is not None:
                return None
            step = _imm(mm.group(1))
            late = (s, j) > (setter[0], setter[1])
    pre = [i for s, b in sorted(bl.items()) if s < head for i in b.instrs]
    init = None
    for i in reversed(pre):
        if i.rest.startswith(reg + ","):
            mm = re.match(rf"{reg}, (?:U?RZ, U?RZ, )?{_IMM}$", i.rest)
            if i.base in ("MOV", "IMAD", "UMOV") and mm:
                init = _imm(mm.group(1))
            break
    if not step or init is None or step > 0x7FFFFFFF:
        return None
    def word(x):  # the 32-bit (low) word the compare sees, unsigned or signed
        x &= 0xFFFFFFFF
        return x if ".U32" in ins.op or x < 1 << 31 else x - (1 << 32)

    v, n = init, 0
    while n < 1 << 20:
        n += 1
        seen = word(v if late else v + step)
        v += step
        if _CMP[cond](seen, bound) == neg:  # the branch back is not taken
            return n
    return None


@dataclasses.dataclass
class KernelModel:
    name: str
    warps: int
    regs: int
    smem: int
    instr: float = 0.0  # executed warp-instructions per warp (per-program per warp)
    req: float = 0.0  # global requests per warp
    sectors: float = 0.0  # L1 sectors per warp
    gbytes: float = 0.0  # global bytes requested per warp
    width: dict = dataclasses.field(default_factory=dict)  # bytes/lane -> requests per warp
    shared: float = 0.0  # shared instructions per warp
    wavefronts: float = 0.0
    loops: list = dataclasses.field(default_factory=list)
    both: int = 0
    flags: list = dataclasses.field(default_factory=list)
    annotated: list = dataclasses.field(default_factory=list)

    def occupancy(self):
        per_warp = math.ceil(max(self.regs, 1) * 32 / 256) * 256
        blocks = min(BLOCKS_SM, WARPS_SM // self.warps, REGS_SM // (per_warp * self.warps),
                     SMEM_SM // (self.smem + 1024))
        return blocks * self.warps / WARPS_SM


def range_trip(text, args):
    """Trip count of ``for v in range(...)`` on source line ``text`` when its bounds are integer
    literals / kernel arguments (``args``: the launch's values by name) joined by + - * //."""
    m = re.search(r"\bfor\s+\w+\s+in\s+(?:tl\.)?range\((.*)\)\s*:", text)
    if not m:
        return None
    try:
        tree = ast.parse(f"f({m.group(1)})", mode="eval").body
    except SyntaxError:
        return None

    def ev(n):
        if isinstance(n, ast.Constant) and isinstance(n.value, int):
            return n.value
        if isinstance(n, ast.Name) and isinstance(args.get(n.id), (int, bool)):
            return int(args[n.id])
        if isinstance(n, ast.BinOp) and isinstance(n.op, (ast.Add, ast.Sub, ast.Mult, ast.FloorDiv)):
            a, b = ev(n.left), ev(n.right)
            return {ast.Add: a + b, ast.Sub: a - b, ast.Mult: a * b, ast.FloorDiv: a // b if b else 0}[type(n.op)]
        raise ValueError(ast.dump(n))

    try:
        vals = [ev(a) for a in tree.args if not isinstance(a, ast.keyword)]
    except ValueError:
        return None
    return len(range(*vals)) if 1 <= len(vals) <= 3 and (len(vals) < 3 or vals[2]) else None


def analyse(k, shape, args) -> KernelModel:
    """Model of one compiled kernel for a case whose input has ``shape``; ``args`` are the
    arguments of one launch by name (for ``range`` bounds)."""
    md = k.metadata
    name = md.name
    usage = resource_usage(k.asm["cubin"])
    sass = _with_cubin(k.asm["cubin"], [_tool("nvdisasm"), "-c", "-g"])
    instrs, labels = S.parse(sass, name)
    bl = S.blocks(instrs, labels)
    km = KernelModel(name, md.num_warps, usage.get("REG", 0), max(usage.get("SHARED", 0), md.shared))

    def trip(loop):
        head, latch, _addr, line = loop
        n = static_trip(bl, head, latch)
        if n is not None:
            return n, "static"
        text = src_line(bl[latch].instrs[-1].file, line)
        n = range_trip(text, args)
        if n is not None:
            return max(n, 0), "args"
        for pat, cnt in TRIP_COUNTS:
            if pat in text:
                return cnt, f"resolver {pat!r}"
        km.flags.append("loop?")
        return DEFAULT_TRIP, f"ASSUMED {DEFAULT_TRIP}"

    km.loops, both, _ = S.weigh(bl, trip, src_line, RARE_BRANCHES)
    km.both = len(both)
    ops = mem_ops(k.asm["ttgir"])
    fallback = [e for v in ops.values() for e in v if e[1] is not None]
    cache = {}
    for b in bl.values():
        for ins in b.instrs:
            w = b.weight
            km.instr += w
            note = ""
            if S.is_global(ins.op) and w:
                nb = S.width(ins.op)
                kind = "load" if ins.base == "LDG" else "store"
                cands = [e for e in ops.get((ins.file, ins.line), []) if e[0] == kind] or \
                    [e for e in fallback if e[0] == kind] or fallback or [(kind, None, 4)]
                # several TTGIR ops at one line: the average of their patterns
                sec = byt = 0.0
                for ent in cands:
                    key = (ent, nb)
                    if key not in cache:
                        _, lay, elem = ent
                        if lay is None:
                            cache[key] = (1.0, float(nb))
                        else:
                            shifts = (0,) if nb >= 8 else tuple(range(max(1, 32 // elem)))
                            cache[key] = S.sectors(lay, nb, elem, shape, shifts)
                    sec += cache[key][0] / len(cands)
                    byt += cache[key][1] / len(cands)
                km.req += w
                km.sectors += w * sec
                km.gbytes += w * byt
                km.width[nb] = km.width.get(nb, 0) + w
                note = f"  [{sec:.1f} sectors, {byt:.0f} B]"
            elif S.is_shared(ins.op) and w:
                km.shared += w
                km.wavefronts += w * math.ceil(32 * S.width(ins.op) / 128)
            km.annotated.append(f"{w:8.0f}  /*{ins.addr:04x}*/ {ins.pred:5s} {ins.op} {ins.rest}"
                                f"  // {ins.line}{note}")
    return km


# =============================================================================
# the model and the report


def model_case(case, launches, ideal, kcache):
    kernels = {}
    for ln in launches:
        key = (ln.kernel.hash, case.name)
        if key not in kcache:
            names = ln.kernel.src.fn.arg_names
            kcache[key] = analyse(ln.kernel, case.shape, dict(zip(names, ln.args)))
        km = kcache[key]
        progs = ln.grid[0] * ln.grid[1] * ln.grid[2]
        row = kernels.setdefault(key, {"km": km, "launches": 0, "programs": 0})
        row["launches"] += 1
        row["programs"] += progs
    return kernels


def _times(instr, sectors, wavefronts, dram_bytes):
    issue = instr / (SMS * ISSUE * CLOCK)
    l1 = (sectors * 32 + wavefronts * 128) / (L1_BYTES * SMS * CLOCK)
    dram = dram_bytes / DRAM_BW
    return issue, l1, dram


def summarise(case, kernels, ideal, outs, err):
    import torch

    n_out = max(outs // torch.empty((), dtype=getattr(torch, case.dtype)).element_size(), 1)
    res = {"case": case.name, "shape": list(case.shape), "dtype": case.dtype, "backward": case.backward,
           "target_pct": case.target, "ideal_bytes": ideal, "outputs": n_out, "error": err, "kernels": []}
    if err or not kernels:
        res["error"] = err or "fallback / no kernel"
        return res
    tot = {"instr": 0.0, "sectors": 0.0, "wavefronts": 0.0, "gbytes": 0.0}
    for row in kernels.values():
        km, progs = row["km"], row["programs"]
        warps = progs * km.warps
        ins, sec, wf, gb = (warps * v for v in (km.instr, km.sectors, km.wavefronts, km.gbytes))
        for k_, v in zip(tot, (ins, sec, wf, gb)):
            tot[k_] += v
        issue, l1, _ = _times(ins, sec, wf, 0)
        wsum = sum(km.width.values()) or 1
        res["kernels"].append({
            "kernel": km.name, "launches": row["launches"], "programs": progs, "warps": km.warps,
            "regs": km.regs, "smem": km.smem, "occupancy": km.occupancy(),
            "instr_per_out": ins / n_out, "gbytes_per_out": gb / n_out, "sectors_per_out": sec / n_out,
            "share_128": km.width.get(16, 0) / wsum, "share_64": km.width.get(8, 0) / wsum,
            "share_32": sum(v for w, v in km.width.items() if w <= 4) / wsum,
            "shared_per_out": warps * km.shared / n_out,
            "issue_us": issue * 1e6, "l1_us": l1 * 1e6, "branches_both_sides": km.both,
            "loops": [{"line": ln_, "trip": n, "how": how} for _, _, ln_, n, how in km.loops],
            "flags": sorted(set(km.flags)) + (["LOW occ"] if km.occupancy() < LOW_OCCUPANCY else []),
        })
    issue, l1, dram = _times(tot["instr"], tot["sectors"], tot["wavefronts"], ideal)
    est = 100 * dram / max(issue, l1, dram)
    res.update({"instr_per_out": tot["instr"] / n_out, "gbytes_per_out": tot["gbytes"] / n_out,
                "sectors_per_out": tot["sectors"] / n_out, "issue_us": issue * 1e6, "l1_us": l1 * 1e6,
                "dram_us": dram * 1e6, "estimate_pct": est,
                "limit": max((("issue", issue), ("L1", l1), ("DRAM", dram)), key=lambda t: t[1])[0],
                "met": est >= case.target})
    return res


def _table(rows, head):
    w = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
    out = ["  ".join(str(h).rjust(w[i]) for i, h in enumerate(head)), "  ".join("-" * x for x in w)]
    out += ["  ".join(str(c).rjust(w[i]) for i, c in enumerate(r)) for r in rows]
    return "\n".join(out)


def report(results):
    head = ["case", "target", "est%", "met", "limit", "instr/out", "B/out", "sect/out",
            "issue us", "L1 us", "DRAM us", "kernels"]
    rows = []
    for r in results:
        if r.get("error"):
            rows.append([r["case"], f"{r['target_pct']:.0f}%", "-", "-", r["error"][:48], *["-"] * 6,
                         len(r["kernels"])])
            continue
        rows.append([r["case"], f"{r['target_pct']:.0f}%", f"{r['estimate_pct']:.1f}",
                     ("met" if r["met"] else "MISS") if r["target_pct"] else "n/a", r["limit"],
                     f"{r['instr_per_out']:.3f}", f"{r['gbytes_per_out']:.2f}", f"{r['sectors_per_out']:.3f}",
                     f"{r['issue_us']:.0f}", f"{r['l1_us']:.0f}", f"{r['dram_us']:.0f}", len(r["kernels"])])
    text = [_table(rows, head), ""]
    khead = ["case", "kernel", "launch", "programs", "warps", "regs", "smem", "occ", "instr/out", "B/out",
             "sect/out", "128b", "64b", "32b", "issue us", "L1 us", "both", "notes"]
    krows = []
    for r in results:
        for k in r["kernels"]:
            loops = ",".join(f"L{lp['line']}x{lp['trip']}({lp['how'].split()[0]})" for lp in k["loops"])
            krows.append([r["case"], k["kernel"], k["launches"], k["programs"], k["warps"], k["regs"], k["smem"],
                          f"{100 * k['occupancy']:.0f}%", f"{k['instr_per_out']:.3f}", f"{k['gbytes_per_out']:.2f}",
                          f"{k['sectors_per_out']:.3f}", f"{100 * k['share_128']:.0f}%",
                          f"{100 * k['share_64']:.0f}%", f"{100 * k['share_32']:.0f}%", f"{k['issue_us']:.0f}",
                          f"{k['l1_us']:.0f}", k["branches_both_sides"], " ".join(k["flags"] + [loops]).strip()])
    text.append(_table(krows, khead))
    return "\n".join(text)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--case", action="append", help="case name substring (repeatable; default: all)")
    ap.add_argument("--list", action="store_true", help="list the cases")
    ap.add_argument("--json", help="write the results to this file")
    ap.add_argument("--sass", help="dump the annotated SASS of kernels whose name contains this")
    args = ap.parse_args(argv)
    cases = [c for c in CASES if not args.case or any(s in c.name for s in args.case)]
    if args.list:
        for c in CASES:
            print(f"{c.name:28s} {c.shape!s:24s} {c.dtype:9s} {'fwd+bwd' if c.backward else 'fwd':8s} "
                  f"target {c.target:.0f}%")
        return 0
    t0 = time.time()
    mods = install()
    results, kcache = [], {}
    for c in cases:
        t1 = time.time()
        launches, ideal, outs, err = capture(c, mods)
        kernels = {} if err else model_case(c, launches, ideal, kcache)
        res = summarise(c, kernels, ideal, outs, err)
        res["seconds"] = round(time.time() - t1, 1)
        results.append(res)
        print(f"  {c.name}: {len(launches)} launches, {res['seconds']} s", file=sys.stderr, flush=True)
        if args.sass:
            for row in kernels.values():
                if args.sass in row["km"].name:
                    print(f"\n== {c.name} / {row['km'].name}: weight  addr  instr  // line [sectors]")
                    print("\n".join(row["km"].annotated))
    print(report(results))
    print(f"\n{len(cases)} cases in {time.time() - t0:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main())
