#!/usr/bin/env bash
# `make 6a`: prep (if needed) -> train on all visible GPUs -> HF export (inside the run) -> lm-eval + val loss -> report.
#
#   make 6a                                          # GPT-2 124M, one epoch of FineWeb-Edu (EXPERIMENT default)
#   make 6a EXPERIMENT=gpt2_124m_fineweb             # the speedrun's data
#   make 6a RECIPE=muon                              # Muon recipe: 3.25B tokens (= EXPERIMENT=gpt2_124m_muon)
#   make 6a ARGS="train.dry_run_steps=50"            # any pretrain override goes to the trainer
#   make 6a NNODES=2 NODE_RANK=0 MASTER_ADDR=10.0.0.1   # multi-node: run on every node with its NODE_RANK
#   BASELINE=1 make 6a                               # also evaluate OpenAI's gpt2 (needs the hub or its cache)
#   EXPERIMENT=smoke EVAL_ARGS="tasks=[]" bash scripts/6a.sh   # the whole chain on CPU in ~2 min (val loss only)
#
# Env from the Makefile: BIN (venv bin), TORCHRUN (torchrun with rendezvous flags), NPROC.
set -euo pipefail
BIN=${BIN:-.venv/bin}
NPROC=${NPROC:-1}
TORCHRUN=${TORCHRUN:-"$BIN/torchrun --standalone --nproc_per_node $NPROC"}
RECIPE=${RECIPE:-adamw}  # adamw: 10B tokens, tuned AdamW; muon: 3.25B tokens, Muon + AdamW (experiment=gpt2_124m_muon)
case "$RECIPE" in
  adamw) EXPERIMENT=${EXPERIMENT:-gpt2_124m_fineweb_edu} ;;
  muon) EXPERIMENT=${EXPERIMENT:-gpt2_124m_muon} ;;
  *) echo "RECIPE: must be adamw or muon, got '$RECIPE'" >&2; exit 2 ;;
esac
OVERRIDES=("experiment=$EXPERIMENT" "$@")

# Resolve the data preset and its shard directory from the composed config (one source of truth).
read -r DATA_OUT DATA_NAME SEQ_LEN VAL_TOKENS < <("$BIN/python" - "${OVERRIDES[@]}" <<'PY'
import sys
from phase6.launch import load_config
cfg = load_config("pretrain", sys.argv[1:])
print(cfg.data.out_dir, cfg.data.name, cfg.train.seq_len, cfg.train.val_tokens)
PY
)
RUN_DIR=${RUN_DIR:-outputs/pretrain/$(date +%Y%m%d-%H%M%S)_6a_${EXPERIMENT}}

echo "== 1/4 prepare-data ($DATA_NAME -> $DATA_OUT): resumes after a kill, verifies when done"
"$BIN/python" - "${OVERRIDES[@]}" <<'PY'
import sys
from phase6.data.prepare import ensure_prepared
from phase6.launch import load_config
ensure_prepared(load_config("pretrain", sys.argv[1:]).data)
PY

echo "== 2/4 train on $NPROC GPU(s) per node -> $RUN_DIR"
$TORCHRUN -m phase6 pretrain "${OVERRIDES[@]}" "run.dir=$RUN_DIR" auto_prepare=false

echo "== 3/4 eval: lm-eval on the HF export + val loss on $DATA_OUT"
read -r -a EVAL_EXTRA <<< "${EVAL_ARGS:-}"
VAL=("val_data=$DATA_OUT" "val_seq_len=$SEQ_LEN" "val_tokens=$VAL_TOKENS")  # the trainer's val/loss windows
"$BIN/phase6" eval "model=$RUN_DIR/hf" "${VAL[@]}" "run.dir=$RUN_DIR/eval" "${EVAL_EXTRA[@]}"
if [[ "${BASELINE:-0}" == "1" ]]; then
  "$BIN/phase6" eval model=gpt2 "${VAL[@]}" "run.dir=$RUN_DIR/eval_gpt2" "${EVAL_EXTRA[@]}"
fi

echo "== 4/4 report"
REPORTS=("$RUN_DIR" "$RUN_DIR/eval")
[[ -d "$RUN_DIR/eval_gpt2" ]] && REPORTS+=("$RUN_DIR/eval_gpt2")
"$BIN/phase6" report "${REPORTS[@]}"
echo "run dir: $RUN_DIR"
