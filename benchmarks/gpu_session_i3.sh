# Next GPU session, call 3 (written 2026-12-01, fifth session; not yet run): issue 8's
# peers, the linear layer side by side (fp4jax auto / xla / pallas, jax.nn's nvfp4
# scaled_dot_general, qwix 0.1.8's nvfp4 training rule) at 8192 tokens, 8192 -> 8192.
# Run with the device tool's carry=[".whl"] (the qwix wheel, `pip download --no-deps -d
# .whl qwix==0.1.8`; on CPU its layer ran on 2026-12-01 with the leading batch axis
# bench_nvfp4._qwix_layer gives it).
export PYTHONPATH=.:/tmp/site PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
timeout 400 python3 benchmarks/bench_nvfp4.py --skip a,b --out $OUT > $OUT/bench_layer.log 2>&1
echo "bench rc=$?"; tail -25 $OUT/bench_layer.log
