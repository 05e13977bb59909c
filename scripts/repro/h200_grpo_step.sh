#!/usr/bin/env bash
# GRPO step at 64 prompts x 8 generations x 512 new tokens on one H200: phase6 after (the new defaults), TRL 1.16's
# stock GRPOTrainer (HF generate), then single-lever ablations while the budget lasts.
# Reproduces docs/benchmarks.md, "6D at the roofline: the GRPO step before / after / TRL stock (issue 31)", and its
# subsection "Second round (issue 31 follow-up): fused sampler, Liger in the engine, right-aligned passes".
#
#   bash scripts/repro/h200_grpo_step.sh CARRY_DIR
#
# Order (PARTS, default "after stock micro_batch_16 right_align_off rollout_levers_off"): after (the bench's defaults:
# micro-batch 32, fused sampler, Liger in the engine, right-aligned passes; 3 steps, 2 timed), TRL stock (1 step, at
# micro-batch 16 as measured), then 2-step ablations (1 timed) while the budget lasts. The second round's measured
# calls (2026-12-02) were, from the checkout:
#   PARTS="after micro_batch_32 right_align_off rollout_levers_off" BUDGET_S=395 bash scripts/repro/h200_grpo_step.sh CARRY
#   MB32_STEPS=3 PARTS="micro_batch_32 stock" BUDGET_S=280 bash scripts/repro/h200_grpo_step.sh CARRY
# (then the bench's default micro-batch was 16, so `after` ran 16 rows). phase6 before (3348fbd) is not re-run: its
# 2026-12-02 row stands (23.32 s).
# CARRY_DIR holds whl/ (trl 1.16.0, datasets 5.2.0, dill 0.4.1, multiprocess 0.70.19, liger-kernel 0.8.5, and the
# Hydra that phase6 imports: hydra-core 1.3.2, omegaconf 2.3.0, antlr4-python3-runtime 4.9.3; the image has torch
# 2.11, transformers 5.17, accelerate, pyarrow, pandas, xxhash, PyYAML, triton 3.6). Recipe for whl/ (here, no
# device time):
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d CARRY_DIR/whl trl==1.16.0 datasets==5.2.0 \
#     dill==0.4.1 multiprocess==0.70.19 liger-kernel==0.8.5 hydra-core==1.3.2 omegaconf==2.3.0 \
#     antlr4-python3-runtime==4.9.3
# The script checks every import it needs before the first part. Every part runs under its own `timeout`, capped by
# what is left of BUDGET_S (default 405 s; with the 5 s kill grace and the summary the script stays under 420 s), so
# the whole script ends inside it even if a part hangs. Writes 2 files to $OUT: grpo_step.tar.xz (every part's JSON
# and log) and grpo_step_summary.md; prints the summary last (its tail: one table of every run, then the new default
# run phase by phase with % of bound).
set -u
CARRY=$(cd "${1:?usage: h200_grpo_step.sh CARRY_DIR}" && pwd)
REPO=$(cd "$(dirname "$0")/../.." && pwd)
BUDGET_S=${BUDGET_S:-405}
START=$SECONDS
OUT=${OUT:-/tmp/i31_out}
WORK=/tmp/i31_work
rm -rf "$WORK" && mkdir -p "$WORK/json" "$OUT"

python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/i31_site \
    "$CARRY"/whl/*.whl || { echo "wheel install failed"; exit 2; }
export PYTHONPATH=/tmp/i31_site
# every import the parts need, before any device time goes to a part that would fail at once
python3 -c "import trl, datasets, liger_kernel, hydra, omegaconf, antlr4" ||
    { echo "missing a wheel in $CARRY/whl (see the header's list)"; exit 2; }
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 WANDB_MODE=offline TOKENIZERS_PARALLELISM=false
export PYTHONUNBUFFERED=1 TRL_EXPERIMENTAL_SILENCE=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$WORK/gpu.txt"

# part NAME MIN_S CAP_S TREE ARGS...: runs TREE/projects/6d_grpo/bench.py --part step ARGS under
# timeout min(CAP_S, time left); skipped when less than MIN_S is left.
part() {
    local name=$1 min=$2 cap=$3 tree=$4
    shift 4
    local left=$((BUDGET_S - (SECONDS - START)))
    if ((left < min)); then
        echo "SKIP $name: ${left}s left < ${min}s" | tee -a "$WORK/parts.txt"
        return
    fi
    local limit=$((left < cap ? left : cap)) t0=$SECONDS rc
    timeout -k 5 "$limit" python3 "$tree/projects/6d_grpo/bench.py" --part step --out "$WORK/json/$name.json" "$@" \
        >"$WORK/$name.log" 2>&1
    rc=$?
    echo "$name rc=$rc $((SECONDS - t0))s (limit ${limit}s): $*" | tee -a "$WORK/parts.txt"
    # per-step times as the trainer logs them (also when the part was cut short), then any error
    grep -o "'time/step_s': '[0-9.e+-]*'" "$WORK/$name.log" | tr '\n' ' '
    echo
    grep -E 'Error|error:|liger:|fused sampling:' "$WORK/$name.log" | tail -n 4
}

# most important first: after (new defaults; 3 steps, the first holds the CUDA-graph captures and Triton JITs), the
# stock anchor (1 step: one HF `generate` rollout is ~1 min; its only step includes TRL's Triton JIT of the fused LM
# head), then one ablation per new lever group while time lasts
# PARTS picks and orders the parts (default: all, in this order); a call that is not the final one may leave out
# the stock anchor, which must run in the same call as the measurement it is compared with
PARTS=${PARTS:-"after stock micro_batch_16 right_align_off rollout_levers_off"}
for p in $PARTS; do
    case $p in
    after) part h200_grpo_step_after 60 125 "$REPO" --steps ${AFTER_STEPS:-3} ;;  # bench defaults: micro-batch 32
    # the stock anchor at the micro-batch it was measured with (2026-12-02: 16, gradient checkpointing as TRL's own)
    stock) part h200_grpo_step_stock_trl 90 150 "$REPO" --step-trainer stock --steps 1 --micro-batch-size 16 ;;
    right_align_off) part h200_grpo_step_after_right_align_off 65 100 "$REPO" --steps ${ABL_STEPS:-2} --right-align off ;;
    rollout_levers_off)
        part h200_grpo_step_after_rollout_levers_off 65 100 "$REPO" --steps ${ABL_STEPS:-2} --fused-sampling off --liger-engine off ;;
    # single-lever runs of the first round's levers at the current defaults (ABL_STEPS=3 gives 2 timed steps each:
    # one timed step did not resolve right_align_off from the step-to-step spread on 2026-12-02)
    liger_off) part h200_grpo_step_after_liger_off 65 110 "$REPO" --steps ${ABL_STEPS:-2} --liger off ;;
    checkpointing_on) part h200_grpo_step_after_checkpointing_on 65 120 "$REPO" --steps ${ABL_STEPS:-2} --gradient-checkpointing on ;;
    # (length buckets off also turns the right-aligned passes off: they need the buckets)
    buckets_off) part h200_grpo_step_after_buckets_off 65 110 "$REPO" --steps ${ABL_STEPS:-2} --length-buckets off ;;
    mismatch_every_1) part h200_grpo_step_after_mismatch_every_1 65 110 "$REPO" --steps ${ABL_STEPS:-2} --mismatch-every 1 ;;
    # the second round's call 1 ran the 16-row defaults as `after` and 32 rows as this part (then not the default)
    micro_batch_16) part h200_grpo_step_after_micro_batch_16 65 125 "$REPO" --steps ${ABL_STEPS:-2} --micro-batch-size 16 ;;
    micro_batch_32) part h200_grpo_step_after_micro_batch_32 65 125 "$REPO" --steps ${MB32_STEPS:-2} --micro-batch-size 32 ;;
    *) echo "unknown part $p" | tee -a "$WORK/parts.txt" ;;
    esac
done

python3 "$REPO/scripts/repro/grpo_step_summary.py" "$WORK/json" >"$OUT/grpo_step_summary.md" 2>&1
tar -C "$WORK" -cJf "$OUT/grpo_step.tar.xz" . 2>/dev/null
echo "total $((SECONDS - START))s"
cat "$WORK/parts.txt"
cat "$OUT/grpo_step_summary.md"
