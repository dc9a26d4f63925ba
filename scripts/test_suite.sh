#!/usr/bin/env bash
# The whole test suite (`make test`) as two pytest sessions side by side.
#
# The cluster tests (namespace nodes running Ray or SLURM, nodes killed and waited for) and the
# Airflow tests (DAG runs, the live Airflow and MLflow servers) spend most of their time waiting:
# measured on the 2-core CI machine they kept 0.4 and 0.8 of its 2 cores busy over 317 s and 256 s,
# against 1.1 for the suite as a whole. So they run in a session of their own, alongside the rest,
# and the machine's idle cores do the other session's work. Both sessions share one SFT warm start
# (tests/fixtures/warm_start.py builds it once under $AREAL_TEST_SHARED_DIR, under a file lock).
#
# The rest of the suite prints as it runs; the waiting session's output follows it. The exit
# status is the first non-zero of the two.
#
#   bash scripts/test_suite.sh [pytest args for both sessions]
set -uo pipefail
cd "$(dirname "$0")/.."

PY=${PY:-.venv/bin/python}
WAITING=(tests/integration/cluster tests/integration/airflow)

shared=$(mktemp -d "${TMPDIR:-/tmp}/areal-suite-XXXXXX")
export AREAL_TEST_SHARED_DIR="$shared"
waiting_pid=
cleanup() {
    if [[ -n "$waiting_pid" ]] && kill -0 "$waiting_pid" 2>/dev/null; then
        kill -INT "$waiting_pid" 2>/dev/null  # pytest's KeyboardInterrupt runs the fixtures' teardowns
        wait "$waiting_pid" 2>/dev/null
    fi
    rm -rf "$shared"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

"$PY" -m pytest "${WAITING[@]}" --durations=10 "$@" >"$shared/waiting.log" 2>&1 &
waiting_pid=$!

ignore=()
for path in "${WAITING[@]}"; do ignore+=("--ignore=$path"); done
"$PY" -m pytest tests "${ignore[@]}" --durations=25 "$@"
main_rc=$?

wait "$waiting_pid"
waiting_rc=$?
waiting_pid=
echo
echo "================ ${WAITING[*]} (run alongside the session above) ================"
cat "$shared/waiting.log"
echo
echo "test suite: main session exit ${main_rc}; ${WAITING[*]}: exit ${waiting_rc}"
if ((main_rc != 0)); then exit "$main_rc"; fi
exit "$waiting_rc"
