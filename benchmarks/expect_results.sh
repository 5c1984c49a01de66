# Stops a device call before it trains anything where the tree it runs over holds another
# count of a study's results than the last `unpack` printed ("N results in studies/
# results/STUDY"): a call over a tree without the last call's results trains their seeds
# again (the twenty-eighth session's call 2 did: 518 s that repeated call 1 bit for bit,
# benchmarks/results/2026-12-04-h200af). Exits 3 then, 0 where the counts agree.
#   bash benchmarks/expect_results.sh STUDY N || exit
STUDY=${1:?the study}
DONE=${2:?the count of results unpack printed last}
HAVE=$(find "studies/results/$STUDY" -maxdepth 1 -name '*.json' 2>/dev/null | wc -l)
if [ "$HAVE" -ne "$DONE" ]; then
  echo "the tree holds $HAVE $STUDY results, not $DONE: unpack the last call first"
  exit 3
fi
