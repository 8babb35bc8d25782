#!/usr/bin/env bash
# Run the scheduling-sensitive test files N times with CPU-bound neighbours beside them.
#
#   scripts/loaded_tests.sh [-n RUNS] [-j NEIGHBOURS] [TEST_FILE ...]
#
# Default: 5 runs, 2 neighbours (each a busy `python -c 'while True: pass'` process), the
# emulated, fault, service and notebook test files. Every run's pytest summary goes to
# stdout and its log to $LOG_DIR (default: a new temporary folder); the exit status is 0
# only when every run passed. Environment: PYTHON (default: python3), PYTEST_ARGS (extra
# pytest arguments, e.g. "-x").
set -u -o pipefail

runs=5
neighbours=2
while getopts "n:j:" opt; do
    case "$opt" in
        n) runs=$OPTARG ;;
        j) neighbours=$OPTARG ;;
        *) echo "usage: $0 [-n RUNS] [-j NEIGHBOURS] [TEST_FILE ...]" >&2; exit 2 ;;
    esac
done
shift $((OPTIND - 1))
files=("$@")
if [ ${#files[@]} -eq 0 ]; then
    files=(tests/emulated/test_emulated.py tests/experiments/test_faults.py tests/workload/test_service.py
           tests/workload/test_service_integrity.py tests/notebook/test_notebooks.py)
fi
python=${PYTHON:-python3}
log_dir=${LOG_DIR:-$(mktemp -d -t residency-loaded-XXXXXX)}
mkdir -p "$log_dir"

pids=()
stop_neighbours() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null; done
    for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null; done
}
trap stop_neighbours EXIT
trap 'exit 130' INT TERM
for _ in $(seq "$neighbours"); do
    "$python" -c 'while True: pass' &
    pids+=("$!")
done

echo "loaded_tests: $runs run(s) of ${files[*]} beside $neighbours CPU-bound neighbour(s);" \
     "load average $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo '?'); logs in $log_dir"
failed=0
for i in $(seq "$runs"); do
    log="$log_dir/run-$i.log"
    start=$(date +%s)
    # shellcheck disable=SC2086  # PYTEST_ARGS is a list of arguments
    "$python" -m pytest -q -p no:cacheprovider ${PYTEST_ARGS:-} "${files[@]}" >"$log" 2>&1
    code=$?
    summary=$(tail -n 1 "$log")
    echo "run $i/$runs: exit $code in $(( $(date +%s) - start )) s, load average" \
         "$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo '?'): $summary"
    if [ "$code" -ne 0 ]; then
        failed=$((failed + 1))
        grep -E '^(FAILED|ERROR) ' "$log" | sed 's/^/    /'
    fi
done
echo "loaded_tests: $((runs - failed)) of $runs run(s) passed"
[ "$failed" -eq 0 ]
