#!/usr/bin/env bash
# Issue 27 on the lent H200: every gpu-marked test, then scripts/check_instruments_gpu.py, in <= 80 s.
# Reproduces: docs/benchmarks.md § GPU tests and the instruments check on the H200 (issue 27)
#
#   mkdir -p /tmp/i27 && tar -xJf .device/i27/repo.tar.xz -C /tmp/i27 && bash /tmp/i27/scripts/repro/h200_gpu_tests.sh $PWD/.device/i27
#
# CARRY/wheels/*.whl (hydra-core 1.3.2, omegaconf 2.3.0, antlr4-python3-runtime 4.9.3, liger-kernel 0.8.5; the image
# has none of them) go into /tmp/i27-site, which is put LAST on PYTHONPATH: where an earlier call already staged
# hydra/omegaconf (the vLLM carry's /tmp/site on PYTHONPATH), those copies win and the carried ones are not needed.
# The test files are the ones holding a `pytest.mark.gpu` test (collecting the whole suite would import trl/datasets,
# which the image lacks). Writes $OUT/i27_gpu_tests.log and $OUT/i27_junit.xml; prints a markdown table last.
set -uo pipefail
CARRY=${1:?usage: h200_gpu_tests.sh CARRY_DIR}
REPO=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-/tmp/i27-out}
mkdir -p "$OUT"
LOG=$OUT/i27_gpu_tests.log
SITE=/tmp/i27-site
cd "$REPO" || exit 4
{
  date -u +"%F %T UTC"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  if compgen -G "$CARRY/wheels/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$CARRY"/wheels/*.whl
  fi
  export PYTHONPATH="$REPO/src${PYTHONPATH:+:$PYTHONPATH}:$SITE"
  export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 WANDB_MODE=offline TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
  python3 -c "import torch, hydra, omegaconf; print('torch', torch.__version__, 'hydra', hydra.__version__, 'omegaconf', omegaconf.__version__)"
  python3 -c "import liger_kernel, importlib.metadata as m; print('liger-kernel', m.version('liger-kernel'))" \
    || echo "liger-kernel missing: the liger tests will skip"
  mapfile -t FILES < <(grep -l "pytest.mark.gpu" tests/test_*.py)
  echo "gpu test files: ${FILES[*]}"
  timeout 60 python3 -m pytest -m gpu -p no:cacheprovider -q -rA --durations=0 --timeout=45 --junitxml="$OUT/i27_junit.xml" \
    "${FILES[@]}"
  echo "pytest rc=$?"
  timeout 16 python3 scripts/check_instruments_gpu.py
  echo "check_instruments_gpu rc=$?"
} > "$LOG" 2>&1
tail -n 40 "$LOG"
# The table: one row per test (from the JUnit XML: an error at teardown counts as an error), then the instrument checks.
python3 - "$OUT/i27_junit.xml" "$LOG" <<'EOF'
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

print("\n| check | result | s |\n|---|---|---|")
junit = Path(sys.argv[1])
if junit.is_file():
    for case in ET.parse(junit).iter("testcase"):
        kinds = [c.tag for c in case if c.tag in ("failure", "error", "skipped")]
        result = "+".join(kinds) or "passed"
        if "skipped" in kinds:
            result += ": " + (case.find("skipped").get("message") or "")[:60]
        print(f"| {case.get('name')} | {result} | {float(case.get('time', 0)):.1f} |")
else:
    print("| pytest | no junit xml (timed out or did not start) | |")
for line in Path(sys.argv[2]).read_text().splitlines():
    if line.startswith(("ok  ", "FAIL")):
        status, _, rest = line.partition(" ")
        print(f"| instruments: {rest.strip()} | {status.strip()} | |")
    elif line.startswith(("pytest rc=", "check_instruments_gpu rc=")):
        print(f"| {line.split('=')[0]} exit | {line.split('=')[1]} | |")
EOF
