# Tenth session, call 3 (<= 9.5 min): issue 9 t1 and t2 after two GPU findings of calls 1-2:
# a four-warpgroup kernel cannot issue an m64n256 wgmma (ptxas compiles every instruction
# within the launch's 128 registers: C7602; it is now two n128 halves), and five
# warpgroups launch with a pool of 96 x 640 registers, so consumers at 192 waited forever
# in setmaxnreg (the budget now fits the pool: 176).
# 1. the pipelined kernel's two-decoder GPU config tests (60 s limit: a hang shows here);
# 2. if they pass: an 8192^3 fprop A/B of the default, 2 decoders (40, 56) and lhs_in_smem
#    (48, 64), two repeats in alternating order, and ptxas -v of their PTX;
# 3. the skinny GPU bitwise tests (overlap and decoder configs among them; 150 s limit);
# 4. the skinny A/B of calls n2 (decoder variants only if step 3 passed).
export PYTHONPATH=. PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
export PATH=$PATH:/usr/local/cuda/bin
FINAL=$OUT; L=/tmp/logs; mkdir -p $L; D=/tmp/ptx; mkdir -p $D
save() { tar czf $FINAL/logs.tgz -C $L .; }
timeout 60 python3 -m pytest -v -x -m gpu tests/kernels/test_gemm_pipelined.py \
  -k "configs and (cfg8 or cfg9)" > $L/test_pipelined_two_decoders.log 2>&1
rc=$?; echo "two-decoder GPU tests rc=$rc"; tail -2 $L/test_pipelined_two_decoders.log; save
if [ $rc = 0 ]; then
MOSAIC_GPU_DUMP_PTX=1 MOSAIC_GPU_DUMP_TO=$D timeout 150 python3 -c "
import dataclasses
from fp4jax.reference.quantization import quantize
from pallas_kernels import gemm
from pallas_kernels.gemm_config import PIPELINED_CONFIG as P
r = lambda **kw: dataclasses.replace(P, **kw)
cfgs = [P, r(rhs_decoder_registers=40, rhs_decoders=2), r(rhs_decoder_registers=56, rhs_decoders=2),
        r(rhs_decoder_registers=48, rhs_decoders=2, lhs_in_smem=True),
        r(rhs_decoder_registers=64, rhs_decoders=2, lhs_in_smem=True)]
gemm._sweep_configs = lambda: {(8192, 8192, 8192): cfgs * 2}
gemm._sweep(quantize)" > $L/sweep_two_decoders.log 2>&1
echo "two-decoder sweep rc=$?"; grep "sweep" $L/sweep_two_decoders.log | cut -c1-60,330-420; save
for p in $D/fp4jax_gemm_pipelined*.ptx; do
  b=$(basename ${p%.ptx}); gzip -c $p > $L/$b.ptx.gz
  timeout 30 ptxas -arch=sm_90a -v "$p" -o /tmp/$b.cubin > $L/$b.ptxas_stderr.txt 2>&1
  echo "== $b: $(grep -h 'C75\|Used\|spill' $L/$b.ptxas_stderr.txt | tr '\n' ' ' | cut -c1-200)"
done; save
fi
timeout 150 python3 -m pytest -v -m gpu tests/kernels/test_gemm_skinny.py -k "bitwise_when" \
  > $L/test_skinny_bitwise.log 2>&1
src=$?; echo "skinny bitwise GPU tests rc=$src"; grep -c PASSED $L/test_skinny_bitwise.log; grep FAILED $L/test_skinny_bitwise.log | cut -c1-150; tail -2 $L/test_skinny_bitwise.log; save
timeout 240 python3 -c "
import dataclasses
from fp4jax.reference.quantization import quantize
from pallas_kernels import gemm_skinny_bench as b
from pallas_kernels.gemm_config import default_config
base = default_config(16, 8192, 8192)
two = dataclasses.replace(base, k_substeps=2)
variants = [base, two, dataclasses.replace(two, overlap_steps=True),
            dataclasses.replace(two, tile_k=256, max_concurrent_steps=4, overlap_steps=True)]
if $src == 0:
    variants += [dataclasses.replace(two, decoders=2, max_concurrent_steps=3),
                 dataclasses.replace(two, decoders=4, max_concurrent_steps=3)]
b._sweep(quantize, variants=variants, repeats=2)" > $L/skinny_ab.log 2>&1
echo "skinny A/B rc=$?"; grep -v "failed" $L/skinny_ab.log | cut -c1-40,200-330 | tail -40; save
