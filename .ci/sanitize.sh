#!/usr/bin/env bash
# The test suite (or the pytest arguments given) against tokcy._core built with
# AddressSanitizer + UndefinedBehaviorSanitizer: any report aborts the run and fails it.
#   .ci/sanitize.sh                   rebuild in place with TOKCY_SANITIZE=1, run the suite
#   .ci/sanitize.sh tests/test_x.py   only those tests (with PYTHONMALLOC=malloc: see below)
#   TOKCY_SANITIZE_NO_BUILD=1 ...     run against the sanitizer build already in place
# PYTHON picks the interpreter (default: python). gcc's libasan (and libstdc++) are preloaded,
# because the interpreter itself is not instrumented. Leave a normal build behind with
#   python setup.py build_ext --inplace --force
set -euo pipefail
PYTHON=${PYTHON:-python}
cd "$(dirname "$0")/.."

if [ "${TOKCY_SANITIZE_NO_BUILD:-0}" = 0 ]; then
    TOKCY_SANITIZE=1 "$PYTHON" setup.py -q build_ext --inplace --force
fi
# the core in place must really be instrumented, or a clean run proves nothing
CORE=$(ls tokcy/_core*.so)
nm -D "$CORE" | grep -q "__asan_report" || { echo "sanitize: $CORE is not built with AddressSanitizer"; exit 1; }
nm -D "$CORE" | grep -q "__ubsan_handle" || { echo "sanitize: $CORE is not built with UBSan"; exit 1; }
LIBASAN=$(gcc -print-file-name=libasan.so)
[ -e "$LIBASAN" ] || { echo "sanitize: gcc has no libasan.so ($LIBASAN)"; exit 1; }
# libstdc++ too: ASan intercepts C++ throws only if the C++ runtime is there when it starts
# (matplotlib's extension throws while it imports)
LIBSTDCXX=$(gcc -print-file-name=libstdc++.so)

REPORTS=$(mktemp -d)
status=0
# Tests whose point is object lifetimes (a request, buffer or table freed while a loop
# points into it), run a second time with every Python object a malloc block.
LIFETIME_TESTS=(tests/test_memory_safety_calls.py tests/test_memory_safety_state.py
                tests/test_memory_safety_views.py tests/test_prepare_ownership.py tests/test_fuzz_calls.py
                tests/test_connector_output_reuse.py tests/test_connector_threads.py
                tests/test_change_tracking.py tests/test_executor_duplicates.py
                tests/test_request_lifecycle.py tests/test_robustness.py tests/test_request_data.py
                tests/test_connector_direct_rows.py tests/test_hostile_requests.py tests/test_hostile_writers.py
                tests/test_hostile_holders.py tests/test_allocation_failures.py)

# detect_leaks=0: CPython's own allocations at exit are not ours to judge; every other
# report halts the process (halt_on_error, and -fno-sanitize-recover=all in the build).
run_pytest() {  # $1: the PYTHONMALLOC to use; then pytest's arguments
    local allocator=$1
    shift
    PYTHONMALLOC=$allocator \
    LD_PRELOAD="$LIBASAN $LIBSTDCXX" \
    ASAN_OPTIONS="detect_leaks=0:halt_on_error=1:log_path=$REPORTS/asan" \
    UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:log_path=$REPORTS/ubsan" \
        "$PYTHON" -m pytest -q -x -p no:cacheprovider "$@" || status=$?
}

if [ "$#" -gt 0 ]; then
    run_pytest malloc "$@"
else
    # 1. the whole suite with Python's own allocator: ASan sees the raw buffers (token
    #    storage, scratch arrays, outputs) and UBSan everything
    run_pytest pymalloc
    # 2. PYTHONMALLOC=malloc: a use of a freed Python object (a buffer, a request) is a
    #    report too; with pymalloc's arenas ASan cannot see those (about 3x slower, hence
    #    the lifetime tests only)
    [ "$status" = 0 ] && run_pytest malloc "${LIFETIME_TESTS[@]}"
fi

# a report in a subprocess (or one pytest survived) still fails the step
if compgen -G "$REPORTS/*" > /dev/null; then
    cat "$REPORTS"/*
    echo "sanitize: the sanitizers reported the errors above"
    exit 1
fi
exit "$status"
