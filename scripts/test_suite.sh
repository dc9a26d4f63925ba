#!/usr/bin/env bash
# The whole test suite (`make test`) as three pytest sessions side by side.
#
# The cluster tests (namespace nodes running Ray or SLURM, nodes killed and waited for) and the
# Airflow tests (DAG runs, the live Airflow and MLflow servers) spend most of their time waiting:
# measured on the 2-core CI machine they kept 0.4 and 0.8 of its 2 cores busy over 317 s and 256 s,
# against 1.1 for the suite as a whole. So they run in a session of their own, alongside the rest,
# and the machine's idle cores do the other sessions' work. The rest is split once more: the
# learning runs (RL and agent programs trained to a reward gain, the recipes, the fault-injection
# jobs: about 40% of the rest's time in a handful of long tests) beside everything else (unit,
# distributed, server and protocol tests), so that the longest session no longer holds the suite's
# wall time alone. The rest still ended last (33.5 min against 29 and 27 on 2026-12-05), its last
# minutes single-threaded unit tests on an otherwise idle core, so three of its multi-process
# files moved out to even the sessions up: the archon pipeline and expert-parallel tests beside
# the cluster and Airflow tests, the FSDP options matrix beside the learning runs. All sessions
# share one SFT warm start (tests/fixtures/warm_start.py builds it once under
# $AREAL_TEST_SHARED_DIR, under a file lock).
#
# The "rest" session prints as it runs; the other sessions' output follows it. The exit status is
# the first non-zero of the three.
#
#   bash scripts/test_suite.sh [pytest args for every session]
set -uo pipefail
cd "$(dirname "$0")/.."

PY=${PY:-.venv/bin/python}
WAITING=(tests/integration/cluster tests/integration/airflow
    tests/distributed/test_archon_pipeline.py tests/distributed/test_archon_expert_parallel.py)
LEARNING=(tests/integration/rl tests/integration/agent_examples tests/integration/recipes
    tests/integration/faults tests/integration/test_sft_demo.py tests/distributed/test_fsdp_options.py)

shared=$(mktemp -d "${TMPDIR:-/tmp}/areal-suite-XXXXXX")
export AREAL_TEST_SHARED_DIR="$shared"
background=()
cleanup() {
    for pid in "${background[@]}"; do
        if kill -0 "$pid" 2>/dev/null; then
            kill -INT "$pid" 2>/dev/null  # pytest's KeyboardInterrupt runs the fixtures' teardowns
            wait "$pid" 2>/dev/null
        fi
    done
    rm -rf "$shared"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

started=$SECONDS
"$PY" -m pytest "${WAITING[@]}" --durations=10 "$@" >"$shared/waiting.log" 2>&1 &
waiting_pid=$!
background+=("$waiting_pid")
"$PY" -m pytest "${LEARNING[@]}" --durations=15 "$@" >"$shared/learning.log" 2>&1 &
learning_pid=$!
background+=("$learning_pid")

ignore=()
for path in "${WAITING[@]}" "${LEARNING[@]}"; do ignore+=("--ignore=$path"); done
"$PY" -m pytest tests "${ignore[@]}" --durations=25 "$@"
rest_rc=$?
echo "(the session above ended after $((SECONDS - started)) s)"

wait "$learning_pid"
learning_rc=$?
wait "$waiting_pid"
waiting_rc=$?
background=()
for name in learning waiting; do
    echo
    if [[ $name == learning ]]; then paths="${LEARNING[*]}"; else paths="${WAITING[*]}"; fi
    echo "================ ${paths} (run alongside the session above) ================"
    cat "$shared/$name.log"
done
echo
echo "test suite after $((SECONDS - started)) s: rest exit ${rest_rc}; learning exit ${learning_rc}; cluster and Airflow exit ${waiting_rc}"
for rc in "$rest_rc" "$learning_rc" "$waiting_rc"; do
    if ((rc != 0)); then exit "$rc"; fi
done
exit 0
