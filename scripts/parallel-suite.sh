#!/usr/bin/env bash
# Proof that the suite does not depend on who else uses the broker: two fresh clones of HEAD run
# `bash scripts/test.sh` at the same time against the same RabbitMQ and Redis. Prints each run's
# exit code and duration; exits non-zero if either failed. Takes about twice as long as one run.
#
#   bash scripts/parallel-suite.sh [PYTEST ARGS...]   (passed to both runs' test.sh)
#
# DLX_PARALLEL_KEEP=1 keeps the clones (each with its .venv) after the run; by default they are
# deleted and only the two logs stay, in the run's directory under ${TMPDIR:-/tmp}.
# Each clone gets its virtualenv and foreign clients first, one clone after the other (two pip or
# apt-get runs at once would fight over their caches and locks); then both suites start together.
set -euo pipefail
cd "$(dirname "$0")/.."

work=$(mktemp -d "${TMPDIR:-/tmp}/dlx-parallel.XXXXXX")
names=(a b)
pids=()

stop_runs() {
  # Each run is a process group of its own: INT lets pytest tear down, KILL if it hangs.
  local pid
  for pid in "${pids[@]}"; do kill -INT -- "-$pid" 2>/dev/null || true; done
  for _ in $(seq 60); do
    local alive=0
    for pid in "${pids[@]}"; do kill -0 -- "-$pid" 2>/dev/null && alive=1; done
    [ "$alive" = 0 ] && return 0
    sleep 1
  done
  for pid in "${pids[@]}"; do kill -KILL -- "-$pid" 2>/dev/null || true; done
}

cleanup() {
  if [ ${#pids[@]} -gt 0 ]; then stop_runs; fi
  if [ -n "${DLX_PARALLEL_KEEP:-}" ]; then
    echo "kept the clones: ${names[*]/#/$work/}"
  else
    for name in "${names[@]}"; do rm -rf "${work:?}/$name"; done
    echo "deleted the clones; logs in $work"
  fi
}
trap cleanup EXIT
trap 'echo "interrupted: stopping both runs" >&2; exit 130' INT TERM

#: Runs argv[1:] with SIGINT at its default disposition (an ignored signal stays ignored in exec).
DEFAULT_SIGINT='import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execvp(sys.argv[1], sys.argv[1:])'

minutes() { printf '%dm%02ds' $(($1 / 60)) $(($1 % 60)); }

echo "== two clones of $(git rev-parse --short HEAD) in $work"
for name in "${names[@]}"; do
  git clone -q . "$work/$name"
done
for name in "${names[@]}"; do
  start=$SECONDS
  echo "== setup of $name"
  if ! (cd "$work/$name" && bash scripts/setup.sh) >"$work/$name-setup.log" 2>&1; then
    tail -n 40 "$work/$name-setup.log" >&2
    echo "setup of $name failed (log: $work/$name-setup.log)" >&2
    exit 1
  fi
  echo "   $(minutes $((SECONDS - start)))"
done

echo "== bash scripts/test.sh $* in both, at the same time (logs: $work/{a,b}.log)"
# Job control on while starting them: each run becomes a process group of its own. SIGINT is set
# back to its default first: a background job (or a script started as one) ignores it, and a
# pytest started ignoring SIGINT cannot be stopped with its teardown (its workers would stay).
set -m
for name in "${names[@]}"; do
  # Each run writes its exit code and duration beside its log.
  python3 -c "$DEFAULT_SIGINT" bash -c '
    cd "$1/$2" || exit 1
    start=$(date +%s)
    rc=0
    bash scripts/test.sh "${@:3}" || rc=$?
    echo $(($(date +%s) - start)) >"$1/$2.seconds"
    echo "$rc" >"$1/$2.rc"
  ' run "$work" "$name" "$@" >"$work/$name.log" 2>&1 &
  pids+=("$!")
done
set +m
for pid in "${pids[@]}"; do wait "$pid" || true; done
pids=()

failed=0
for name in "${names[@]}"; do
  rc=$(cat "$work/$name.rc" 2>/dev/null || echo "none")
  seconds=$(cat "$work/$name.seconds" 2>/dev/null || echo 0)
  echo "run $name: exit $rc in $(minutes "$seconds") (log: $work/$name.log)"
  if [ "$rc" != 0 ]; then
    failed=1
    echo "--- last lines of run $name" >&2
    tail -n 40 "$work/$name.log" >&2
  fi
done
exit "$failed"
