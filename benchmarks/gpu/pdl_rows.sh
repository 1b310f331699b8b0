#!/usr/bin/env bash
# PDL by launch size on a lent GPU (kernels/pdl.py, TOOLKIT_PDL_MAX_ROWS): the 1k bench with PDL on every launch,
# on the one-row launches only, and off, each with the epilogues on and off; then bench_switch for the row limit
# (bit-identical outputs) and the compiled engine test of the epilogues. From the repository root, on the GPU:
#   OUT=/some/dir bash benchmarks/gpu/pdl_rows.sh
set -uo pipefail
out=${OUT:?set OUT}; mkdir -p "$out"; log=$out/log.txt
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1; unset TRITON_INTERPRET
budget=${BUDGET:-270}
bench=(python benchmarks/bench_gpu.py --cuda-graphs --kernels triton)
run() {  # run NAME ENV... : the 1k bench under those variables, when 25 s are left
    local name=$1; shift
    if [ $((budget - SECONDS)) -lt 25 ]; then echo "$name: skipped" | tee -a "$log"; return; fi
    env "$@" timeout $((budget - SECONDS)) "${bench[@]}" > "$out/$name.json" 2>> "$log"
    python - "$out/$name.json" "$name" "$*" <<'PY' | tee -a "$log"
import json, sys
try:
    d = json.load(open(sys.argv[1]))
    print(f"{sys.argv[2]} ({sys.argv[3]}): PDL {d['pdl']} epilogues {d['epilogues']} decode {d['decode_ms']} ms "
          f"{d['decode_vs_roofline']:.1%}; verify 2/8/16 {d['verify_ms']['2']}/{d['verify_ms']['8']}/{d['verify_ms']['16']} ms; "
          f"verify 8 {d['verify_ms']['8'] / d['decode_ms']:.3f}x; draft in chain {d['draft_step_in_chain_ms']} ms "
          f"{d['draft_step_in_chain_ms'] / d['decode_ms']:.2%}; tree-60 loop {d['draft_loop_tree60_ms']} ms")
except Exception as e:
    print(sys.argv[2], "failed:", e)
PY
}
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$log"
run all TOOLKIT_PDL=on TOOLKIT_EPILOGUES=on
run rows1 TOOLKIT_PDL=on TOOLKIT_PDL_MAX_ROWS=1 TOOLKIT_EPILOGUES=on
run off TOOLKIT_PDL=off TOOLKIT_EPILOGUES=on
run rows1_noep TOOLKIT_PDL=on TOOLKIT_PDL_MAX_ROWS=1 TOOLKIT_EPILOGUES=off
run off_noep TOOLKIT_PDL=off TOOLKIT_EPILOGUES=off
TOOLKIT_PDL_MAX_ROWS=1 TOOLKIT_EPILOGUES=on timeout $((budget - SECONDS)) python benchmarks/bench_switch.py \
    --switch pdl > "$out/switch_rows1.json" 2>> "$log"; echo "bench_switch pdl, rows <= 1: rc=$?" | tee -a "$log"
tail -c 600 "$out/switch_rows1.json" | tee -a "$log"
TOOLKIT_PDL=on TOOLKIT_PDL_MAX_ROWS=1 timeout $((budget - SECONDS)) python -m pytest -q -x \
    tests/infer/kernels/test_epilogues.py -k engine 2>&1 | tail -3 | tee -a "$log"
run all_again TOOLKIT_PDL=on TOOLKIT_EPILOGUES=on
