"""benchmarks/sass_loop_counts.py: a quantize kernel's main loop found in its SASS."""

from benchmarks import sass_loop_counts as slc

# A cuobjdump -sass listing in miniature: a loop (predicated back edge to 0x0020) and,
# after EXIT, a barrier-wait retry stub that jumps back unconditionally from a higher
# address than the loop's (a longer span than the loop's, but not a loop).
_LISTING = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;                 /* 0x00000a0000017a02 */
        /*0010*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P1, [UR4], R6 ;
        /*0020*/                   LOP3.LUT R2, R3, 0xf0f0f0f, RZ, 0xc0, !PT ;
        /*0030*/                   ST.E.64 [R8.64], R2 ;
        /*0040*/                   FMNMX R4, R4, R5, !PT ;
        /*0050*/               @P0 BRA 0x20 ;                             /* 0xfffffffc00f00947 */
        /*0060*/                   FSEL R6, R4, RZ, P1 ;
        /*0070*/                   EXIT ;
        /*0080*/                   SYNCS.PHASECHK.TRANS64 P1, [UR4], R6 ;
        /*0090*/              @!P1 BRA 0x80 ;
        /*00a0*/                   BRA 0x10 ;
"""


def test_main_loop_is_the_longest_predicated_back_edge_not_a_retry_stub(tmp_path):
    """The loop is 0x20..0x50 (4 instructions, split after the ST.E.64 into 2 + 2); the
    retry stub's unconditional BRA back to 0x10 spans 9 instructions and is no loop."""
    path = tmp_path / "k.sass"
    path.write_text(_LISTING)
    instrs = slc.instructions(str(path))
    assert [(a, p) for a, _, _, p in instrs if a in (0x50, 0xa0)] == [(0x50, True), (0xa0, False)]
    loop = slc.main_loop(instrs)
    assert [a for a, *_ in loop] == [0x20, 0x30, 0x40, 0x50]
    r = slc.summarize(str(path), per_thread=2, split=r"ST\.E\.64")
    assert r["loop"] == 4 and r["parts"] == [1.0, 1.0]
    assert r["pipes_per_element"]["alu"] == 1.0  # LOP3 and FMNMX over 2 elements
