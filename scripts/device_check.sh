#!/usr/bin/env bash
# One prepared check for a lent GPU machine (one NVIDIA GPU, no network), within 8 minutes:
#   1. a virtual environment with a CUDA build of torch: from the package index as the README
#      documents (pip install torch --index-url .../whl/cu128) when the index answers; without
#      a network, over the machine's own CUDA torch (--system-site-packages) plus the wheels
#      carried in $WHEELS (see --fetch-wheels);
#   2. the project installed into it;
#   3. `residency selftest --device "$DEVICE" --json` (everything it wrote kept);
#   4. a short profiled pair: `residency pair --design profiled-pair --device cuda --ranks 1
#      --steps 5`;
#   5. the selftest JSON, both run directories (as .tar.gz: the results channel carries at
#      most 8 files, 2 folders deep), nvidia-smi and the log copied to $OUT.
# With --evidence, steps 3-4 are instead the evidence of issue #42 on one rank (for
# data/runs/): first the release-cost curve (benchmarks/release_cost.py: empty_cache with C GiB
# cached and re-acquiring C GiB, C up to the 25 % bound; release_cost.csv always,
# release_cost.png when matplotlib imports, both straight into $OUT), then the paired profile
# with the NPU's telemetry failure injected into the baseline (--inject-failure
# generic-telemetry) at --scale auto (the service holds 85 % of the GPU): the profiled 50-step
# pair, then $PAIRS alternating unprofiled pairs of $REQUESTS requests each. CONSECUTIVE=1
# adds the consecutive-request validation (3 requests of 2 steps) at the same scale. On
# DEVICE=emulated-npu (the dry run) nothing is injected (the emulated NPU fails already).
# Exit status: 0 when every step passed, 1 when one failed, 2 when the environment could not
# be set up.
#
# Usage, on the GPU machine, from the repository root (the device tool sets $OUT; carry .whl):
#   OUT=/some/dir scripts/device_check.sh
# Beforehand, on a machine that reaches the package index (wheels for the GPU machine's
# Python 3.12 / x86-64, into .whl/, which .gitignore keeps out of git):
#   scripts/device_check.sh --fetch-wheels
# A dry run of the whole script without a GPU (offline path, emulated NPU):
#   DEVICE=emulated-npu BASE_PYTHON=/path/to/python-with-torch scripts/device_check.sh
set -uo pipefail

cd "$(dirname "$0")/.." || exit 2
ROOT=$PWD
WHEELS=${WHEELS:-$ROOT/.whl}
TORCH_INDEX=https://download.pytorch.org/whl/cu128   # the README's CUDA install command
# what the GPU machine's image lacks of the project's dependencies (torch, numpy, pandas,
# scipy and tqdm are there), plus a setuptools new enough for pyproject's license
OFFLINE_WHEELS=(msgspec platformdirs setuptools wheel)
# optional: the release-cost figure (the benchmark writes its CSV without it): matplotlib
# and its dependencies but numpy (the image has it)
OPTIONAL_WHEELS=(matplotlib contourpy cycler fonttools kiwisolver pillow pyparsing
    python-dateutil packaging six)
VLLM_OMNI=0.30.0   # as .ci/run

if [ "${1:-}" = "--fetch-wheels" ]; then
    mkdir -p "$WHEELS"
    python3 -m pip download --no-deps --only-binary=:all: --python-version "${PY_VERSION:-3.12}" \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 -d "$WHEELS" msgspec platformdirs 'setuptools>=77' wheel || exit 2
    # the published vLLM-Omni, installed there without its dependencies (as CI does): the
    # selftest's adapter step then checks the adapter against its real module_residency.py
    python3 -m pip download --no-deps -d "$WHEELS" "vllm-omni==$VLLM_OMNI" || exit 2
    # matplotlib and its dependencies (optional on the GPU machine: the figure only)
    python3 -m pip download --no-deps --only-binary=:all: --python-version \
        "${PY_VERSION:-3.12}" --implementation cp --platform manylinux_2_28_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$WHEELS" \
        "${OPTIONAL_WHEELS[@]}" ||
        echo "matplotlib wheels not fetched: the release-cost figure will be skipped there"
    ls -l "$WHEELS"
    exit 0
fi

MODE=check
if [ "${1:-}" = "--evidence" ]; then MODE=evidence; fi
if [ "$MODE" = evidence ]; then   # sized for one 8-minute lease at --scale auto: measured on
    # an H200, each service run took ~50 s (~30 s its start), so 3 pairs of 2 requests ran
    # past the 400 s cap after 7 of 8 runs; 1 pair of 1 request: 247 s in all
    PAIRS=${PAIRS:-1}
    REQUESTS=${REQUESTS:-1}
else
    PAIRS=${PAIRS:-6}
    REQUESTS=${REQUESTS:-3}
fi
CONSECUTIVE=${CONSECUTIVE:-0}
STEPS=${STEPS:-50}
DEVICE=${DEVICE:-cuda}   # DEVICE=emulated-npu: a dry run of this script on a machine without a GPU
START_S=$SECONDS
OUT=${OUT:-$ROOT/device-check-out}
mkdir -p "$OUT" || exit 2
WORK=$(mktemp -d /tmp/residency-device-check.XXXXXX)
trap 'rm -rf "$WORK"' EXIT   # everything worth keeping is copied to $OUT
VENV=$WORK/venv
LOG=$OUT/device_check.log
: >"$LOG"

BUDGET_S=${BUDGET_S:-460}   # everything, installs included, ends inside 8 minutes
# cap MAX RESERVE: a timeout of at most MAX seconds that still leaves RESERVE seconds after it
cap() {
    local left=$((BUDGET_S - (SECONDS - START_S) - $2))
    if [ "$left" -lt "$1" ]; then echo $((left > 30 ? left : 30)); else echo "$1"; fi
}
log() { printf '[device_check %4ss] %s\n' "$((SECONDS - START_S))" "$*" | tee -a "$LOG" >&2; }
run() { log "\$ $*"; "$@" >>"$LOG" 2>&1; }

# --- the machine --------------------------------------------------------------------------
{ nvidia-smi || echo "nvidia-smi failed"; } >"$OUT/nvidia-smi.txt" 2>&1
log "GPU: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader \
    2>/dev/null || echo unknown)"

# --- 1. a venv with the CUDA torch build --------------------------------------------------
has_torch() {  # has_torch PYTHON: a torch that can drive $DEVICE
    if [ "$DEVICE" = cuda ]; then
        "$1" -c 'import sys, torch; sys.exit(0 if torch.version.cuda else 1)' >/dev/null 2>&1
    else
        "$1" -c 'import torch' >/dev/null 2>&1
    fi
}
purelib() { "$1" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'; }
online_venv() {
    run python3 -m venv "$VENV" &&
        run timeout "$(cap 240 330)" "$VENV/bin/python" -m pip install -q --timeout 15 \
            --retries 1 torch --index-url "$TORCH_INDEX" &&
        run timeout "$(cap 120 320)" "$VENV/bin/python" -m pip install -q --timeout 15 \
            --retries 1 -e "$ROOT"
}
offline_venv() {
    # the image's python that holds a CUDA torch (a plain python3 there, per the machine notes)
    local base=""
    for candidate in "${BASE_PYTHON:-}" python3 /opt/torch/.venv/bin/python3; do
        if [ -n "$candidate" ] && has_torch "$candidate"; then base=$candidate; break; fi
    done
    if [ -z "$base" ]; then log "no python with a torch for $DEVICE found"; return 1; fi
    log "offline: venv over $base ($("$base" -c 'import torch; print(torch.__version__)'))"
    rm -rf "$VENV"
    # without ensurepip, a venv without pip: the base's pip (reached through the .pth line
    # below) then installs into this venv, the interpreter that runs it
    if ! run "$base" -m venv "$VENV"; then
        rm -rf "$VENV"
        run "$base" -m venv --without-pip "$VENV" || return 1
    fi
    # that python may itself be a venv (--system-site-packages would reach past it to the
    # interpreter it was made from): its packages join ours through a .pth line, after ours
    purelib "$base" >"$(purelib "$VENV/bin/python")/residency-base-site.pth" || return 1
    if [ -d "$WHEELS" ]; then
        for wheel in "${OFFLINE_WHEELS[@]}"; do
            run "$VENV/bin/python" -m pip install -q --upgrade --no-index --find-links "$WHEELS" \
                "$wheel" || log "carried wheel $wheel did not install"
        done
        if [ "$MODE" = evidence ] && ! "$VENV/bin/python" -c 'import matplotlib' 2>/dev/null; then
            run "$VENV/bin/python" -m pip install -q --no-index --find-links "$WHEELS" \
                matplotlib || log "matplotlib not installed: no release-cost figure"
        fi
    else
        log "no $WHEELS folder: packages missing from the image cannot be installed"
    fi
    run "$VENV/bin/python" -m pip install -q --no-index --no-build-isolation --no-deps \
        -e "$ROOT" || return 1
    # every runtime dependency must import (the project was installed without resolving them)
    # (pyproject's [project] dependencies, by import name)
    run "$VENV/bin/python" -c 'import numpy, pandas, scipy, msgspec, tqdm, platformdirs, torch'
}

if [ "$DEVICE" = cuda ] && online_venv && has_torch "$VENV/bin/python"; then
    log "venv: torch from $TORCH_INDEX"
elif offline_venv && has_torch "$VENV/bin/python"; then
    log "venv: the machine's torch, project installed offline"
else
    log "could not set up a venv with a torch for $DEVICE and the project (see $LOG)"
    exit 2
fi
PY=$VENV/bin/python
RESIDENCY=$VENV/bin/residency
for wheel in "$WHEELS"/vllm_omni-"$VLLM_OMNI"-*.whl; do
    [ -e "$wheel" ] || continue
    run "$PY" -m pip install -q --no-index --no-deps "$wheel" ||
        log "vllm-omni did not install: the selftest's adapter step will skip"
done
log "torch $("$PY" -c 'import torch; print(torch.__version__, "CUDA", torch.version.cuda)')"

if [ "$MODE" = check ]; then
# --- 2. selftest ----------------------------------------------------------------------------
SELFTEST_S=$(cap 300 150)
log "selftest (at most $SELFTEST_S s)"
PYTHONUNBUFFERED=1 timeout "$SELFTEST_S" "$RESIDENCY" selftest --device "$DEVICE" --json \
    --out "$WORK/selftest" >"$OUT/selftest.json" 2>>"$LOG"
SELFTEST_RC=$?
log "selftest exit $SELFTEST_RC"
"$PY" - "$OUT/selftest.json" <<'EOF' 2>&1 | tee -a "$LOG" >&2
import json, sys
try:
    report = json.load(open(sys.argv[1]))
except ValueError as exc:
    sys.exit(f"selftest.json is not JSON: {exc}")
for s in report["steps"]:
    print(f"  {s['status']:<8} {s['name']:<12} {s['seconds']:7.1f} s  {s['detail'][:160]}")
    if s["status"] == "failed":
        print(f"           {s['error_type']}: {s['error'].splitlines()[0][:300]}")
EOF

# --- 3. a short profiled pair -----------------------------------------------------------------
PAIR_S=$(cap 240 30)
log "profiled pair (at most $PAIR_S s)"
PYTHONUNBUFFERED=1 timeout "$PAIR_S" "$RESIDENCY" pair --design profiled-pair --device "$DEVICE" \
    --ranks 1 --steps 5 --out "$WORK/$DEVICE-profiled-pair-1r5s" --no-progress >>"$LOG" 2>&1
PAIR_RC=$?
log "pair exit $PAIR_RC"
if [ -d "$WORK/$DEVICE-profiled-pair-1r5s" ]; then
    run "$RESIDENCY" verify "$WORK/$DEVICE-profiled-pair-1r5s"
    run "$RESIDENCY" idle "$WORK/$DEVICE-profiled-pair-1r5s/runs/01-candidate" \
        --marker 'residency\.release\[normal\]' --no-cache
fi
fi

# --- 2-3 (--evidence): the recorded designs ------------------------------------------------
evidence_run() {  # evidence_run NAME MAX_S ARGS...: one `residency pair` run, verified
    local name=$1 max_s
    max_s=$(cap "$2" 20)
    shift 2
    log "$name (at most $max_s s)"
    PYTHONUNBUFFERED=1 timeout "$max_s" "$RESIDENCY" pair --device "$DEVICE" --ranks 1 \
        --seed 2101 --out "$WORK/$name" --no-progress "$@" >>"$LOG" 2>&1
    local rc=$?
    log "$name exit $rc"
    [ "$rc" -eq 0 ] || return "$rc"
    run "$RESIDENCY" verify "$WORK/$name" || return 1
    run "$RESIDENCY" tables "$WORK/$name" || log "(no evidence table for $name)"
}
INJECT=(--inject-failure generic-telemetry)   # CUDA: the NPU's failure, in the baseline
TAG=injected-
if [ "$DEVICE" != cuda ]; then INJECT=(); TAG=""; fi   # npu: real or absent; emulated: failing
CONSECUTIVE_RUN=$DEVICE-${TAG}consecutive-auto-1r2s
PAIRED=$DEVICE-${TAG}paired-profile-auto-1r${STEPS}s
CURVE_RC=0
CONSECUTIVE_RC=0
PAIRED_RC=0
if [ "$MODE" = evidence ]; then
    CURVE_S=$(cap 120 300)
    log "release-cost curve (at most $CURVE_S s)"
    # shellcheck disable=SC2086  # RELEASE_ARGS: extra options, word-split on purpose
    PYTHONUNBUFFERED=1 timeout "$CURVE_S" "$PY" "$ROOT/benchmarks/release_cost.py" \
        --device "$DEVICE" --out "$OUT" ${RELEASE_ARGS:-} 2>&1 | tee -a "$LOG" >&2
    CURVE_RC=${PIPESTATUS[0]}
    log "release-cost curve exit $CURVE_RC"
    [ ${#INJECT[@]} -gt 0 ] || log "$DEVICE: no failure injected (npu: real or absent; \
emulated-npu: its generic queries fail already)"
    if [ "$CONSECUTIVE" = 1 ]; then
        evidence_run "$CONSECUTIVE_RUN" 120 --design consecutive --requests 3 --steps 2 \
            --scale auto "${INJECT[@]}"
        CONSECUTIVE_RC=$?
    fi
    evidence_run "$PAIRED" 400 --design paired-profile --pairs "$PAIRS" \
        --requests "$REQUESTS" --steps "$STEPS" --scale auto "${INJECT[@]}"
    PAIRED_RC=$?
fi

# --- 4. results to $OUT ---------------------------------------------------------------------
pack() {  # pack NAME DIR: DIR as $OUT/NAME.tar.gz, without traces if over 15 MiB
    local name=$1 dir=$2
    [ -d "$dir" ] || return 0
    tar -czf "$OUT/$name.tar.gz" -C "$(dirname "$dir")" "$(basename "$dir")"
    if [ "$(stat -c %s "$OUT/$name.tar.gz")" -gt $((15 * 1024 * 1024)) ]; then
        log "$name.tar.gz is over 15 MiB: packed again without trace files"
        tar -czf "$OUT/$name.tar.gz" --exclude='*.trace.json' -C "$(dirname "$dir")" \
            "$(basename "$dir")"
    fi
}
if [ "$MODE" = evidence ]; then
    pack "$CONSECUTIVE_RUN" "$WORK/$CONSECUTIVE_RUN"
    pack "$PAIRED" "$WORK/$PAIRED"
    log "done in $((SECONDS - START_S)) s: curve exit $CURVE_RC, consecutive exit \
$CONSECUTIVE_RC, paired exit $PAIRED_RC"
    find "$OUT" -maxdepth 1 -type f -printf '%10s %f\n' | tee -a "$LOG" >&2
    [ "$CURVE_RC" -eq 0 ] && [ "$CONSECUTIVE_RC" -eq 0 ] && [ "$PAIRED_RC" -eq 0 ]
    exit
fi
pack "$DEVICE-selftest" "$WORK/selftest"
pack "$DEVICE-profiled-pair-1r5s" "$WORK/$DEVICE-profiled-pair-1r5s"
log "done in $((SECONDS - START_S)) s: selftest exit $SELFTEST_RC, pair exit $PAIR_RC"
find "$OUT" -maxdepth 1 -type f -printf '%10s %f\n' | tee -a "$LOG" >&2
[ "$SELFTEST_RC" -eq 0 ] && [ "$PAIR_RC" -eq 0 ]
