"""``benchmarks/gpu_static.py``: the static H200 model of the Triton engine.

The parser / counter tests are synthetic (no compilation, no Triton).  The end-to-end test is
opt-in (``TORCHFILTERS_TRITON_AOT=1``): it compiles real sm_90 kernels through Triton's JIT with
the script's stand-in driver, in a child process without ``TRITON_INTERPRET`` (which the suite's
Triton fixtures set)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

BENCH = os.path.join(os.path.dirname(__file__), "..", "benchmarks")
sys.path.insert(0, BENCH)
import gpu_static as G
import gpu_static_sass as S

SASS = """
_k:
.text._k:
\t//## File "/x.py", line 10
        /*0000*/                   MOV R2, RZ ;
        /*0010*/                   IMAD.MOV.U32 R5, RZ, RZ, 0x0 ;
.L_x_0:
\t//## File "/x.py", line 11
        /*0020*/                   LDG.E.128 R8, desc[UR4][R2.64] ;
        /*0030*/                   VIADD R5, R5, 0x1 ;
        /*0040*/                   ISETP.NE.AND P0, PT, R5, 0x8, PT ;
        /*0050*/               @P0 BRA `(.L_x_0) ;
\t//## File "/x.py", line 12
        /*0060*/                   ISETP.GT.U32.AND P1, PT, R8, 0x727fffff, PT ;
        /*0070*/              @!P1 BRA `(.L_x_1) ;
        /*0080*/                   MOV R26, 0xa0 ;
        /*0090*/                   CALL.REL.NOINC `($__internal_0_$__slowpath) ;
.L_x_1:
\t//## File "/x.py", line 13
        /*00a0*/                   ISETP.NE.AND P2, PT, R9, RZ, PT ;
        /*00b0*/               @!P2 BRA `(.L_x_3) ;
        /*00c0*/                   FADD R8, R8, R8 ;
        /*00d0*/                   FADD R8, R8, R8 ;
.L_x_3:
\t//## File "/x.py", line 14
        /*00e0*/                   STG.E [R2.64], R8 ;
        /*00f0*/               @P2 LDS R3, [R2] ;
        /*0100*/                   EXIT ;
$__internal_0_$__slowpath:
        /*0110*/                   FADD R8, R8, R8 ;
        /*0120*/                   RET.REL.NODEC R26 `(_k) ;
.L_x_2:
        /*0130*/                   BRA `(.L_x_2);
"""


def _weighed(rare=()):
    instrs, labels = S.parse(SASS, "_k")
    bl = S.blocks(instrs, labels)

    def trip(loop):
        head, latch, _, _ = loop
        return G.static_trip(bl, head, latch), "static"

    src = {13: "if rare_thing:"}
    info, both, cut = S.weigh(bl, trip, lambda f, n: src.get(n, ""), rare)
    return instrs, bl, info, both, cut


def test_parse_lines_targets_and_widths():
    instrs, labels = S.parse(SASS, "_k")
    assert [i.addr for i in instrs][:3] == [0, 0x10, 0x20]
    assert labels[".L_x_0"] == 0x20 and labels["$__internal_0_$__slowpath"] == 0x110
    ldg = instrs[2]
    assert (ldg.op, ldg.line, ldg.file, S.width(ldg.op)) == ("LDG.E.128", 11, "/x.py", 16)
    assert instrs[3].base == "VIADD" and instrs[5].pred == "@P0" and instrs[5].target == ".L_x_0"
    assert S.width("STG.E") == 4 and S.width("LDG.E.U16") == 2 and S.width("LDG.E.64") == 8
    assert S.is_global("STG.E") and S.is_shared("LDS") and not S.is_global("LDS")


def test_weights_loops_slow_paths_and_branches():
    _, bl, info, both, cut = _weighed()
    w = {s: b.weight for s, b in bl.items()}
    assert info == [(0x20, 0x50, 11, 8, "static")]  # init 0, step 1, exit at 8
    assert w[0x0] == 1 and w[0x20] == 8 and w[0x60] == 1
    assert w[0x80] == 0  # calls an internal slow path
    assert w[0x110] == 0 and w[0x130] == 0  # reached only by CALL / padding
    assert w[0xC0] == 1 and w[0xE0] == 1  # the runtime if: both sides counted ...
    assert both == [(0xB0, 13, "if rare_thing:")] and cut == []
    total = sum(b.weight * len(b.instrs) for b in bl.values())
    assert total == 2 + 4 * 8 + 2 + 2 + 2 + 3
    _, bl, _, both, cut = _weighed(rare=("if rare",))  # ... unless its line is a rare pattern
    assert bl[0xC0].weight == 0 and bl[0xE0].weight == 1 and both == [] and cut[0][1] == 13


def test_static_trip_counts_the_compare_before_the_step():
    text = SASS.replace("""        /*0030*/                   VIADD R5, R5, 0x1 ;
        /*0040*/                   ISETP.NE.AND P0, PT, R5, 0x8, PT ;""",
                        """        /*0030*/                   ISETP.NE.AND P0, PT, R5, 0x8, PT ;
        /*0040*/                   VIADD R5, R5, 0x2 ;""")
    instrs, labels = S.parse(text, "_k")
    bl = S.blocks(instrs, labels)
    assert G.static_trip(bl, 0x20, 0x20) == 5  # R5 = 0, 2, 4, 6, 8: the compare sees 8 at trip 5


def test_static_trip_of_a_uniform_counter_through_plop3():
    text = SASS.replace("""        /*0010*/                   IMAD.MOV.U32 R5, RZ, RZ, 0x0 ;""",
                        """        /*0010*/                   UMOV UR21, 0x1 ;""")
    text = text.replace("""        /*0030*/                   VIADD R5, R5, 0x1 ;
        /*0040*/                   ISETP.NE.AND P0, PT, R5, 0x8, PT ;
        /*0050*/               @P0 BRA `(.L_x_0) ;""", """        /*0030*/                   UIADD3 UR21, UP1, UR21, 0x2, URZ ;
        /*0038*/                   UISETP.GE.U32.AND UP0, UPT, UR21, 0x11, UPT ;
        /*0040*/                   PLOP3.LUT P4, PT, PT, PT, UP0, 0x80, 0x0 ;
        /*0050*/              @!P4 BRA `(.L_x_0) ;""")
    instrs, labels = S.parse(text, "_k")
    bl = S.blocks(instrs, labels)
    assert G.static_trip(bl, 0x20, 0x20) == 8  # for t in range(1, 17, 2)
    text = text.replace("UMOV UR21, 0x1 ;", "UMOV UR21, 0xffffffff ;").replace("0x11, UPT", "0xf, UPT")
    instrs, labels = S.parse(text, "_k")
    bl = S.blocks(instrs, labels)
    assert G.static_trip(bl, 0x20, 0x20) == 8  # from -1 (low word 0xffffffff): 1, 3, ..., 15


def test_range_trip_from_launch_arguments():
    assert G.range_trip("        for s in range(SY):", {"SY": 3}) == 3
    assert G.range_trip("for e in range(1, N2, 2):", {"N2": 9}) == 4
    assert G.range_trip("for t in tl.range(NA, NA + NB):", {"NA": 2, "NB": 5}) == 5
    assert G.range_trip("for b in range(lo, hi + 1, BB):", {"BB": 4}) is None  # lo, hi: loaded values
    assert G.range_trip("x = 1", {}) is None


LAYOUT = "#blocked = #ttg.blocked<{sizePerThread = [%s], threadsPerWarp = [%s], warpsPerCTA = [%s], order = [%s]}>"


def test_sectors_of_the_blocked_layouts():
    lay = S.blocked_layouts(LAYOUT % ("1, 4", "4, 8", "4, 1", "1, 0"))["blocked"]
    assert lay == ((1, 4), (4, 8), (4, 1), (1, 0))
    spt4 = ((4,), (32,), (4,), (0,))
    # scalar loads of a 4-per-thread layout: lanes 16 B apart, 16 sectors for 128 useful bytes
    assert S.sectors(spt4, 4, 4, (4096,)) == (16, 128)
    # shifted by 4..7 elements the warp straddles one more sector
    assert S.sectors(spt4, 4, 4, (4096,), range(8)) == (16.5, 128)
    assert S.sectors(spt4, 16, 4, (4096,)) == (16, 512)  # one 128-bit request: 4 sectors per 128 B
    spt1 = ((1,), (32,), (4,), (0,))
    assert S.sectors(spt1, 4, 4, (4096,)) == (4, 128)
    assert S.sectors(spt1, 4, 4, (4096,), range(8)) == ((4 + 7 * 5) / 8, 128)  # unknown alignment
    assert S.sectors(spt1, 4, 4, (28,)) == (4, 112)  # lanes past the row are masked
    # rows of 8 lanes x 4 elements, 4 rows a request, row stride 28 floats: 112 B apart
    secs, used = S.sectors(lay, 4, 4, (28, 28))
    assert used == 4 * 7 * 4  # 7 of 8 lanes a row are inside the 28 columns
    assert secs == 14  # 4 adjacent rows of 112 B: 448 contiguous bytes, every sector touched


def test_occupancy():
    km = G.KernelModel("k", warps=8, regs=46, smem=1024)
    assert km.occupancy() == 40 / 64  # 48 regs x 256 threads: 5 blocks of 8 warps
    assert G.KernelModel("k", warps=4, regs=255, smem=0).occupancy() == 8 / 64


@pytest.mark.skipif(os.environ.get("TORCHFILTERS_TRITON_AOT") != "1", reason="set TORCHFILTERS_TRITON_AOT=1")
def test_model_of_real_kernels(tmp_path):
    """Opt-in: the model of two cases compiled for sm_90 (about a minute on a cold cache)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    src = os.path.join(os.path.dirname(__file__), "..", "src")
    env["PYTHONPATH"] = os.pathsep.join([src, env.get("PYTHONPATH", "")])
    out = tmp_path / "model.json"
    res = subprocess.run([sys.executable, os.path.join(BENCH, "gpu_static.py"), "--case", "gm_central_bf16",
                          "--case", "sobel_f32_4096", "--json", str(out)], check=False, env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    results = json.loads(out.read_text())
    assert [r["case"] for r in results] == ["gm_central_bf16", "sobel_f32_4096"]
    for r in results:
        assert r["error"] is None and r["kernels"], r
        assert 0 < r["estimate_pct"] <= 100 and r["instr_per_out"] > 0 and r["sectors_per_out"] > 0
        assert r["limit"] in ("issue", "L1", "DRAM")
        for k in r["kernels"]:
            assert k["programs"] > 0 and k["warps"] > 0 and k["regs"] > 0 and 0 < k["occupancy"] <= 1
    assert "est%" in res.stdout and "gm_central_bf16" in res.stdout


# An unconditional 64-bit ``%`` (no fast path: a plain CALL inside a BSSY / WARPSYNC region),
# then a 64-bit ``//`` with its 32-bit fast path (the CALL on the slow side, in a nested
# BSSY B1), then a second call of the ``%`` helper.  The helper has a counted loop.
SASS_CALL = """
_k2:
.text._k2:
\t//## File "/y.py", line 20
        /*0000*/                   MOV R2, RZ ;
        /*0010*/                   BSSY B0, `(.L_x_5) ;
        /*0020*/                   WARPSYNC.ALL ;
        /*0030*/                   MOV R20, 0x50 ;
        /*0040*/                   CALL.REL.NOINC `($__internal_1_$__cuda_sm20_rem_s64) ;
.L_x_5:
        /*0050*/                   BSYNC B0 ;
\t//## File "/y.py", line 21
        /*0060*/                   ISETP.NE.U32.AND P0, PT, R0, RZ, PT ;
        /*0070*/                   BSSY B0, `(.L_x_7) ;
        /*0080*/              @!P0 BRA `(.L_x_6) ;
        /*0090*/                   BSSY B1, `(.L_x_8) ;
        /*00a0*/                   MOV R20, 0xc0 ;
        /*00b0*/                   CALL.REL.NOINC `($__internal_2_$__cuda_sm20_div_s64) ;
.L_x_8:
        /*00c0*/                   BSYNC B1 ;
        /*00d0*/                   BRA `(.L_x_7) ;
.L_x_6:
        /*00e0*/                   I2F.U32.RP R4, R5 ;
        /*00f0*/                   MUFU.RCP R4, R4 ;
.L_x_7:
        /*0100*/                   BSYNC B0 ;
\t//## File "/y.py", line 22
        /*0110*/                   MOV R20, 0x130 ;
        /*0120*/                   CALL.REL.NOINC `($__internal_1_$__cuda_sm20_rem_s64) ;
        /*0130*/                   STG.E [R2.64], R4 ;
        /*0140*/                   EXIT ;
$__internal_1_$__cuda_sm20_rem_s64:
        /*0150*/                   MOV R7, 0x0 ;
.L_x_10:
        /*0160*/                   IADD3 R7, R7, 0x1, RZ ;
        /*0170*/                   ISETP.NE.AND P1, PT, R7, 0x4, PT ;
        /*0180*/               @P1 BRA `(.L_x_10) ;
        /*0190*/                   RET.REL.NODEC R20 `(_k2) ;
$__internal_2_$__cuda_sm20_div_s64:
        /*01a0*/                   IABS R6, R5 ;
        /*01b0*/                   RET.REL.NODEC R20 `(_k2) ;
.L_x_11:
        /*01c0*/                   BRA `(.L_x_11);
"""


def _weigh_text(text, function):
    instrs, labels = S.parse(text, function)
    bl = S.blocks(instrs, labels)

    def trip(loop):
        head, latch, _, _ = loop
        return G.static_trip(bl, head, latch), "static"

    info, both, _ = S.weigh(bl, trip)
    return bl, info, both


def test_unconditional_calls_are_executed_and_their_callees_counted():
    bl, info, both = _weigh_text(SASS_CALL, "_k2")
    w = {s: b.weight for s, b in bl.items()}
    # the code after the unconditional CALL (BSYNC, the split) keeps its weight
    assert w[0x0] == 1 and w[0x50] == 1 and not bl[0x0].slow
    # the 64-bit // : the CALL on the slow side (same line as the @!P0 BRA, rejoining) is not taken
    assert bl[0x90].slow and w[0x90] == 0 and w[0xC0] == 0  # ... nor its BSYNC B1
    assert w[0xE0] == 1 and w[0x100] == 1 and both == []  # the fast side; a split is not "both"
    # the helper runs once per call (two call sites), its loop 4 times a call; div_s64 never
    assert w[0x150] == 2 and w[0x160] == 8 and w[0x190] == 2
    assert w[0x1A0] == 0 and w[0x1C0] == 0
    assert info == [(0x160, 0x180, 22, 4, "static")]
    total = sum(b.weight * len(b.instrs) for b in bl.values())
    kernel = 5 + 4 + 2 + 5  # 0x00-0x40, 0x50-0x80, the fast side, 0x100-0x140
    callee = 1 + 3 * 4 + 1  # MOV, the loop, RET
    assert total == kernel + 2 * callee


def test_calls_in_a_runtime_if_are_counted_and_the_branch_reported():
    # the same CALL, but its block's source line is not the branch's: a user `if`, not a split
    text = SASS_CALL.replace("""        /*0090*/                   BSSY B1""",
                             """\t//## File "/y.py", line 23\n        /*0090*/                   BSSY B1""")
    bl, _, both = _weigh_text(text, "_k2")
    assert not bl[0x90].slow and bl[0x90].weight == 1 and bl[0xC0].weight == 1
    assert bl[0x1A0].weight == 1 and [b[0] for b in both] == [0x80]
    # ... unless the callee is a `*slowpath*` helper, which a split always guards
    bl, _, _ = _weigh_text(text.replace("div_s64", "div_rn_noftz_f32_slowpath"), "_k2")
    assert bl[0x90].slow and bl[0x90].weight == 0 and bl[0x1A0].weight == 0
