# Twentieth session's device calls (issue 12; <= 10 min each). Device tool:
#   bash benchmarks/gpu_session_z.sh 1    (then 2, then 3 [BUDGET]), no carry.
# Unpack each call's results here before the next (the device runs on a copy of this
# tree): python studies/validation.py unpack pure_llama --from FILES_AT/pure_llama; report.
# Call 1's replay goes to a scratch folder, never whole into studies/results:
#   python studies/validation.py unpack pure_llama --results /tmp/replay --from FILES_AT/replay
#   cp /tmp/replay/prose-tpp10-paper{,_tail}-s{18,19,20}.json studies/results/pure_llama/
# Record the calls as benchmarks/results/2026-12-0X-h200x/README.md, keep the autotune/
# dumps that hold programs the committed picks lack (`autotune_picks.py compare`), and
# merge them, the committed file first so that no program's pick changes:
#   python benchmarks/autotune_picks.py merge studies/autotune_picks.textproto \
#     studies/autotune_picks.textproto FILES_AT/autotune/*.textproto.gz
#
# Call 1 asks whether a seed's run depends on the seeds it trains beside. On prose the
# paired gaps cluster by seed batch (docs/STUDY.md, "Seeds trained together": the
# cluster-robust standard error is 1.98x the independent one over 4 clusters; the
# nineteenth session's batch s12-17 averaged +3.6% against +0.8% for s0-11), while on
# Python they do not (0.96x over 9). Each seed has its own initialization, data order
# and SR keys, and a batch is one vmapped program, so a seed's run should not depend on
# its partners: the replay trains prose paper s12-14 again, in a batch of six whose
# other three seeds (18-20) are new, at the same positions and with the same committed
# picks, and `validation.py repeats` says whether s12-14 repeat the committed runs bit
# for bit (their BF16-forward tails, forked, too). If they do, the clustering is not the
# batch's doing; s18-20 are kept as new prose pairs either way (their BF16 runs: call 3).
# Then the headline pair on Python goes on to 50 seeds (its gap's sd over 44 pairs,
# 1.05 pp, needs ~50 for ±0.3 pp), and call 3 adds no_sr seeds 3-7 (n=8).
# Estimates (`batch_plans.batch_wall_estimate`, `fork_wall_estimate` on the committed
# results): paper in six 312 s plus its six forks 97 s (prose and Python alike), BF16 in
# three 109 s, no_sr in five 306 s.
export PYTHONPATH=. PYTHONUNBUFFERED=1
case ${1:?call 1, 2 or 3} in
  1)  # replay: prose paper s12-14 beside new s18-20, forking paper_tail (~409 s); Python BF16 s44-46
    R=/tmp/replay
    mkdir -p "$R" "$OUT/autotune" /tmp/replayed
    cp studies/results/pure_llama/*.json "$R/"
    rm "$R"/prose-tpp10-paper{,_tail}-s1{2,3,4}.json
    XLA_FLAGS="--xla_gpu_load_autotune_results_from=$PWD/studies/autotune_picks.textproto \
--xla_gpu_dump_autotune_results_to=$OUT/autotune/0-replay.textproto" \
    timeout 480 python3 studies/validation.py run pure_llama --results "$R" \
      --budget-s 450 --reserve-s 5 --seed-batch 6 --variants paper,paper_tail \
      --corpora prose --seeds 12,13,14,18,19,20 --handoff "$OUT/replay" \
      --compile-cache none --progress > /tmp/replay.log 2>&1
    echo "== replay: rc=$?, $SECONDS s into the call"
    tail -c 2000 /tmp/replay.log
    cp "$R"/prose-tpp10-paper{,_tail}-s1{2,3,4}.json /tmp/replayed/
    python3 studies/validation.py repeats pure_llama --results /tmp/replayed
    if [ -f "$OUT/autotune/0-replay.textproto" ]; then gzip -f "$OUT/autotune/0-replay.textproto"; fi
    bash benchmarks/gpu_studies_call.sh $((596 - SECONDS)) pure_llama:bf16:python:44,45,46:3 ;;
  2)  # Python paper s44-49 forking paper_tail (~409 s); BF16 s47-49 (~109 s)
    bash benchmarks/gpu_studies_call.sh 596 \
      pure_llama:paper,paper_tail:python:44,45,46,47,48,49:6 \
      pure_llama:bf16:python:47,48,49:3 ;;
  3)  # prose BF16 s18-20 (~109 s), the pairs of call 1's new seeds; no_sr s3-7 (~306 s)
    bash benchmarks/gpu_studies_call.sh "${2:-560}" pure_llama:bf16:prose:18,19,20:3 \
      pure_llama:no_sr:python:3,4,5,6,7:5 ;;
esac
