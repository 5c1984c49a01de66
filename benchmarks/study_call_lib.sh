# Sourced by the validation study's device-call scripts (gpu_studies_call.sh,
# gpu_replay_call.sh), so that their budgets are checked alike and their processes get
# the same XLA flags: the flags are part of JAX's compilation-cache key, and a replay
# on a warm machine is served by the study calls' cache only where they match.
CALL_LIMIT=600  # the device tool's limit on one command, in seconds

# Exits 2 unless $1 is whole seconds leaving 40 s of the call limit for the last
# process's handoff.
check_call_budget() {
  if ! [[ "$1" =~ ^[0-9]+$ ]] || [ "$1" -gt $((CALL_LIMIT - 40)) ]; then
    echo "BUDGET must be whole seconds, at most $((CALL_LIMIT - 40)) (40 s of the" \
      "${CALL_LIMIT} s call limit for the last process's handoff), got '$1'"
    exit 2
  fi
}

# Prints a study process's XLA flags: the caller's own, the committed autotuning picks
# loaded (where the tree has them) and the picks dumped to $1.
study_xla_flags() {
  local load=
  if [ -f studies/autotune_picks.textproto ]; then
    load="--xla_gpu_load_autotune_results_from=$PWD/studies/autotune_picks.textproto"
  fi
  echo "${XLA_FLAGS:+$XLA_FLAGS }${load:+$load }--xla_gpu_dump_autotune_results_to=$1"
}
