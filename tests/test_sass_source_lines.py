"""benchmarks/sass_source_lines.py: a kernel loop's SASS counted per Python source line."""

from benchmarks import sass_source_lines as ssl

# An nvdisasm --print-line-info listing in miniature: a K loop (conditional back edge to
# .L_x_1) holding a wgmma, and a barrier-wait retry stub after EXIT that jumps back into
# the loop unconditionally (not a loop).
_LISTING = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
.L_x_1:
	//## File "/w/pallas_kernels/decode.py", line 12
        /*0010*/                   LOP3.LUT R2, R3, 0xf0f0f0f, RZ, 0xc0, !PT ;
        /*0020*/                   SHF.R.U32.HI R7, RZ, 0x4, R3 ;
        /*0030*/                   PRMT R4, R2, 0x8180, R7 ;
        /*0040*/                   IMAD R4, R4, 0x1040, RZ ;
        /*0050*/                   LOP3.LUT R4, R4, 0x81c081c0, RZ, 0xc0, !PT ;
        /*0060*/                   HMUL2.BF16_V2 R4, R4, R8 ;
	//## File "/w/pallas_kernels/gemm.py", line 40
        /*0070*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P1, [UR4], R6 ;
        /*0080*/              @!P1 BRA `(.L_x_9) ;
.L_x_2:
        /*0090*/                   HGMMA.64x256x16.F32.BF16 R24, R4, gdesc[UR8], R24 ;
        /*00a0*/                   UIADD3 UR5, UR5, 0x1, URZ ;
        /*00b0*/               @P0 BRA `(.L_x_1) ;
        /*00c0*/                   EXIT ;
.L_x_9:
        /*00d0*/                   SYNCS.PHASECHK.TRANS64 P1, [UR4], R6 ;
        /*00e0*/              @!P1 BRA `(.L_x_9) ;
        /*00f0*/                   BRA `(.L_x_2) ;
"""


def test_the_loop_holding_the_wgmma_counted_per_source_line():
    """The conditional back edge's span is the loop (not the stub's jump back); each
    instruction is charged to the source line above it, most instructions first."""
    instrs, labels = ssl.parse(_LISTING)
    body = ssl.loop(instrs, labels, containing="HGMMA")
    assert [a for a, _, _ in body] == list(range(0x10, 0xc0, 0x10))
    rows = ssl.by_source_line(body)
    assert rows[0][0] == ("decode.py", 12)
    assert dict(rows[0][1]) == {"LOP3": 2, "SHF": 1, "PRMT": 1, "IMAD": 1, "HMUL2": 1}
    assert rows[1][0] == ("gemm.py", 40)
    assert rows[1][1]["HGMMA"] == 1 and rows[1][1]["BRA"] == 2  # to the stub; back edge
    assert ssl.opcode("@!P1 BRA `(.L_x_9)") == "BRA"
    assert ssl.loop(instrs, labels, containing="NO_SUCH_OP") == []
