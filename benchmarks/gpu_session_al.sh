# Device calls for the prose pairs s151-228 that Stein's two-stage rule adds to pure_llama
# (issue 12; study_specs.py): from the thirty-first session's last call on.
# Device tool, every call with carry ["studies/handoff"] (the previous call's compilation
# cache, where unpacked; a new session's checkout has none):
#   bash benchmarks/gpu_session_al.sh DONE BUDGET
# DONE: the count of results `unpack` printed last ("N results in studies/results/
# pure_llama"). BUDGET: status budget_left_s - 70, and 100 s less again where status says
# not warm (a cold start held 48-97 s beyond the command's wall on 2026-12-04, and the
# call's limit shrinks by it); <= 560. A start the tool refuses ("No device machine could
# be started right now") still cost 90 s of budget; one that finds the machine "being given
# back" (the 30 s idle ran out) cost nothing beyond that idle, and the next start is cold.
# The call stops at once, before any training, where the tree holds another count of
# pure_llama results.
# Between calls, at once (the device tool keeps a machine 30 s after a call): python
# studies/validation.py unpack pure_llama --from FILES_AT/pure_llama, then the next call.
# A new checkout has no .venv, which `unpack` needs: `make setup` before the first call.
#
# Batches of the sizes whose programs earlier calls compiled: the paper recipe in sixes
# (243-318 s, 107-108 ms a batched step) and BF16 in fives (151-167 s, 66.4-67.3 ms); 78 seeds
# make thirteen paper sixes and fourteen BF16 fives and a three. The paper recipe is asked
# for first: on a warm machine a full call trains two paper sixes (524-527 s, 12 units;
# the second runs on the first's programs) where the first takes at most ~263 s, else a
# paper six and a BF16 five (455 s, 11 units; after a 268 s six, 250 s were left for a
# second's ~250 s); on a cold one a paper six and a BF16 five (479-531 s, 11 units), and
# once the paper seeds are done, three BF16 fives. A short call still trains BF16 (a five
# needs ~152 s where the machine or the carried parts hold BF16's programs, ~167 s otherwise,
# and a cold call for one five 182 s of wall and 275 s held; the three ~118 s by the
# estimate). A batch takes the first seeds of its range that no finished unit holds; one
# that does not fit prints a line and waits.
bash benchmarks/expect_results.sh pure_llama "${1:?the count of results unpack printed last}" \
  || exit
bash benchmarks/gpu_studies_call.sh "${2:?the call budget in seconds}" \
  "pure_llama:paper:prose:$(seq -s, 151 228):6" \
  "pure_llama:bf16:prose:$(seq -s, 151 228):5"
