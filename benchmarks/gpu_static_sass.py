"""SASS reading for ``gpu_static.py``: parse ``nvdisasm -c -g`` text, build basic blocks, find
loops, weight blocks by how often a typical program executes them, and count L1 sectors of a
warp-wide request.  Pure text / arithmetic: no Triton, no compilation (the unit test feeds it a
synthetic listing).

Counting rules (documented in ``gpu_static``'s docstring as well):

* a block's weight is the product of the trip counts of the loops that contain it (a loop = the
  address range ``[header, latch]`` of a backward branch; compiler output is reducible);
* blocks not reachable from the entry or from an executed ``CALL`` are 0 (padding, subroutines
  only a slow path calls);
* a ``CALL`` of an internal subroutine (``$__internal_*``: 64-bit division, the ``sqrt_rn`` /
  ``div_rn`` slow paths) on the SLOW side of a fast / slow split is not taken: its block is 0,
  and so is whatever is reachable only through it.  A split = a forward conditional ``BRA`` at
  the call's own source line, one of whose successors is the calling block (a ``BSSY`` /
  ``WARPSYNC`` / ``MOV`` of the return address before the ``CALL`` stays in that block) while
  the other one rejoins the code after it; a callee named ``*slowpath*`` is always a slow path;
* every other ``CALL`` (e.g. a 64-bit ``%`` with no fast path) is executed: the code after it
  keeps the block's weight, and the callee's blocks (up to its ``RET``, with their own loops)
  get the calling block's weight once per call, added up over the call sites;
* a conditional branch whose source line matches a *rare* pattern (e.g. ``if _any(``) is taken
  the typical way: the guarded region (the successor that flows into the other one) is cut;
* every other conditional branch counts both sides (an upper bound) and is reported.
"""

from __future__ import annotations

import dataclasses
import re

_INS = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;?\s*$")
_LINE = re.compile(r'//## File "([^"]+)", line (\d+)')
_LABEL = re.compile(r"^\s*([.$\w]+):\s*$")
_TARGET = re.compile(r"`\(([^)]+)\)")


@dataclasses.dataclass
class Instr:
    addr: int
    pred: str  # "" or "@P0" / "@!P5" ...
    op: str  # full opcode with modifiers, e.g. "LDG.E.128"
    rest: str  # operands
    line: int  # source line (0 if unknown)
    file: str = ""
    target: str | None = None  # branch / call target label

    @property
    def base(self) -> str:
        return self.op.split(".")[0]


@dataclasses.dataclass
class Block:
    start: int
    instrs: list
    succ: list = dataclasses.field(default_factory=list)
    weight: float = 0.0
    slow: bool = False  # calls an internal subroutine on the slow side of a fast / slow split
    calls: list = dataclasses.field(default_factory=list)  # callee entries, one per CALL


def _internal(ins: Instr) -> bool:
    return ins.base == "CALL" and (ins.target or "").startswith("$__internal")


def parse(text: str, function: str):
    """``(instrs, labels)`` of ``function`` (its own body and the subroutines after it)."""
    instrs, labels, pending, line, file, inside = [], {}, [], 0, "", False
    for raw in text.splitlines():
        m = _LABEL.match(raw)
        if m:
            name = m.group(1)
            if name == function:
                inside = True
            pending.append(name)
            continue
        m = _LINE.search(raw)
        if m:
            file, line = m.group(1), int(m.group(2))
            continue
        if raw.lstrip().startswith(".section") and inside and function not in raw:
            inside = False
        m = _INS.match(raw)
        if not m or not inside:
            continue
        addr, body = int(m.group(1), 16), m.group(2).rstrip(" ;")
        for name in pending:
            labels[name] = addr
        pending = []
        pred = ""
        if body.startswith("@"):
            pred, body = body.split(None, 1)
        parts = body.split(None, 1)
        t = _TARGET.search(body)
        instrs.append(Instr(addr, pred, parts[0], parts[1] if len(parts) > 1 else "", line,
                            file, t.group(1) if t else None))
    return instrs, labels


def _ends_block(ins: Instr) -> bool:
    return ins.base in ("BRA", "EXIT", "RET", "BRX", "JMX", "JMP")


def blocks(instrs, labels):
    """Basic blocks (by start address) with successor lists."""
    leaders = {instrs[0].addr} if instrs else set()
    leaders |= {a for a in labels.values()}
    for i, ins in enumerate(instrs):
        if _ends_block(ins) and i + 1 < len(instrs):
            leaders.add(instrs[i + 1].addr)
    out, cur = {}, None
    for ins in instrs:
        if ins.addr in leaders:
            cur = out[ins.addr] = Block(ins.addr, [])
        cur.instrs.append(ins)
    starts = sorted(out)
    for i, s in enumerate(starts):
        b = out[s]
        last = b.instrs[-1]
        nxt = starts[i + 1] if i + 1 < len(starts) else None
        uncond = last.base in ("BRA", "EXIT", "RET") and last.pred in ("", "@PT")
        if last.base == "BRA" and last.target in labels:
            b.succ.append(labels[last.target])
        if not uncond and nxt is not None:
            b.succ.append(nxt)
        b.calls = [labels[i.target] for i in b.instrs if i.base == "CALL" and labels.get(i.target) in out]
        b.slow = any(_internal(i) and "slowpath" in i.target for i in b.instrs)
    for s, b in out.items():  # the slow sides of fast / slow splits
        last = b.instrs[-1]
        if last.base != "BRA" or not last.pred or len(b.succ) != 2:
            continue
        for t, other in (b.succ, b.succ[::-1]):
            calls = [i for i in out[t].instrs if _internal(i)] if t > s else []
            if not calls or other == t or any(i.line != last.line for i in calls):
                continue
            after = set().union(*(_reach(out, u) for u in out[t].succ))
            if after & _reach(out, other, stop=t):
                out[t].slow = True
    return out


def loops(bl):
    """``[(header, latch_start, latch_end, line)]`` for each backward branch."""
    out = []
    for s, b in bl.items():
        last = b.instrs[-1]
        for t in b.succ:
            if t <= s and last.base == "BRA":
                out.append((t, s, last.addr, last.line))
    return out


def _reach(bl, start, cut=frozenset(), stop=None):
    seen, todo = set(), [start]
    while todo:
        s = todo.pop()
        if s in seen or s not in bl or bl[s].slow or s == stop:
            continue
        seen.add(s)
        todo.extend(t for t in bl[s].succ if (s, t) not in cut)
    return seen


def weigh(bl, trip, src_line=lambda f, n: "", rare=()):
    """Set ``Block.weight``; return ``(loops, both_sides, rare_cut)`` for the report.

    ``trip(loop) -> (count, how)`` gives each loop's trip count; ``src_line(n)`` the text of
    source line ``n`` (for the ``rare`` patterns)."""
    if not bl:
        return [], [], []
    entry = min(bl)
    lp = loops(bl)
    back = {(latch, head) for head, latch, _, _ in lp}
    cut, both, rare_cut = set(), [], []
    for s, b in bl.items():
        last = b.instrs[-1]
        if last.base == "EXIT" and last.pred and len(b.succ) == 1:
            # ``if rare: ...`` at the end of a kernel compiles to ``@!P EXIT``: the fall-through
            # is the rare region
            text = src_line(last.file, last.line)
            if any(p in text for p in rare):
                cut.add((s, b.succ[0]))
                rare_cut.append((last.addr, last.line, text.strip()))
            continue
        if last.base != "BRA" or not last.pred or len(b.succ) != 2 or any(e in back for e in ((s, t) for t in b.succ)):
            continue
        a, c = b.succ
        text = src_line(last.file, last.line)
        if any(p in text for p in rare):
            # the region is the successor that flows into the other one (the join)
            ra, rc = c in _reach(bl, a, back), a in _reach(bl, c, back)
            if ra != rc:
                region = a if ra else c
                cut.add((s, region))
                rare_cut.append((last.addr, last.line, text.strip()))
                continue
        if not any(bl[t].slow for t in b.succ):
            both.append((last.addr, last.line, text.strip()))
    cut = frozenset(cut)
    info, counts, weight, reached = [], {}, dict.fromkeys(bl, 0.0), set()

    def region(start, mult, active):
        """Add ``mult`` x (loop factors) to the blocks reachable from ``start`` (the entry, or a
        callee up to its ``RET``), then recurse into the subroutines they call."""
        live = _reach(bl, start, cut)
        reached.update(live)
        mine = [lo for lo in lp if lo[1] in live]
        for lo in mine:
            if (lo[0], lo[1]) not in counts:
                n, how = trip(lo)
                counts[(lo[0], lo[1])] = n
                info.append((lo[0], lo[2], lo[3], n, how))
        for s in sorted(live):
            w = mult
            for head, latch, _, _ in mine:
                if head <= s <= latch:
                    w *= counts[(head, latch)]
            weight[s] += w
            for callee in bl[s].calls:
                if w and callee not in active:  # no recursion (compiler helpers do not recurse)
                    region(callee, w, active | {callee})

    region(entry, 1.0, frozenset({entry}))
    both = [b for b in both if any(bl[a].instrs[-1].addr == b[0] for a in reached)]
    for s, b in bl.items():
        b.weight = weight[s]
    return info, both, rare_cut


# ---------------------------------------------------------------- instruction classes

def width(op: str) -> int:
    """Bytes per lane of a memory instruction (``LDG.E.128`` -> 16, ``LDG.E.U16`` -> 2)."""
    mods = op.split(".")[1:]
    for m, w in (("128", 16), ("64", 8), ("U16", 2), ("S16", 2), ("U8", 1), ("S8", 1)):
        if m in mods:
            return w
    return 4


def is_global(op: str) -> bool:
    return op.split(".")[0] in ("LDG", "STG", "ATOMG", "REDG", "RED", "ATOM")


def is_shared(op: str) -> bool:
    return op.split(".")[0] in ("LDS", "STS", "LDSM", "ATOMS")


# ---------------------------------------------------------------- layouts and sectors

_BLOCKED = re.compile(r"#(\w+)\s*=\s*#ttg\.blocked<\{sizePerThread = \[([\d, ]+)\], threadsPerWarp = \[([\d, ]+)\], "
                      r"warpsPerCTA = \[([\d, ]+)\], order = \[([\d, ]+)\]")


def blocked_layouts(ttgir: str):
    """``{name: (sizePerThread, threadsPerWarp, warpsPerCTA, order)}`` of a TTGIR module."""
    out = {}
    for m in _BLOCKED.finditer(ttgir):
        out[m.group(1)] = tuple(tuple(int(v) for v in m.group(i).split(",")) for i in range(2, 6))
    return out


def lane_coords(layout, v_elems: int, j: int):
    """Tile coordinates of the first element each of the 32 lanes touches in one request:
    lane ``l`` holds ``sizePerThread`` elements; the request covers elements ``j .. j+v`` of each
    thread's run along the fastest dim ``order[0]``."""
    spt, tpw, _, order = layout
    nd = len(spt)
    out = []
    for lane in range(32):
        c, rem = [0] * nd, lane
        for d in order:  # threads are laid out fastest dim first
            c[d] = rem % tpw[d]
            rem //= tpw[d]
        c = [c[d] * spt[d] for d in range(nd)]
        c[order[0]] += j
        out.append(c)
    return out


def sectors(layout, nbytes: int, elem: int, shape, shift_elems=(0,)):
    """``(sectors, bytes)`` per request, averaged over the element runs of a thread and over the
    ``shift_elems`` start offsets (unknown alignment).

    The tile's dims map to the trailing dims of ``shape`` (a contiguous tensor): strides are
    row-major, a lane whose coordinate is past ``shape`` is masked off (the tile at the origin;
    interior tiles of big images are not masked)."""
    spt, _, _, order = layout
    nd = len(spt)
    shp = list(shape)[-nd:] if len(shape) >= nd else [1] * (nd - len(shape)) + list(shape)
    strides, acc = [0] * nd, 1
    for d in reversed(range(nd)):
        strides[d] = acc
        acc *= shp[d]
    v = max(1, nbytes // elem)
    runs = range(0, max(spt[order[0]], v), v)
    tot_s = tot_b = n = 0
    for j in runs:
        for sh in shift_elems:
            secs, used = set(), 0
            for c in lane_coords(layout, v, j):
                if any(c[d] >= shp[d] for d in range(nd)):
                    continue
                a = (sum(c[d] * strides[d] for d in range(nd)) + sh) * elem
                used += nbytes
                secs.update(range(a // 32, (a + nbytes - 1) // 32 + 1))
            tot_s += len(secs)
            tot_b += used
            n += 1
    return tot_s / n, tot_b / n
