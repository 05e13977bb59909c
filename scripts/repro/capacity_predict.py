"""The fleet simulator's capacity for a serve-bench capacity run, before the run: the numbers the run itself writes to
prediction.json before its first probe (projects/6b_serving/capacity.py ``predict``), printed as a table. Reproduces
the prediction in docs/benchmarks.md "6B capacity at an SLO: vLLM on one H200 (issue 33)".

    python scripts/make_dummy_model.py qwen2.5-14b outputs/models/qwen2.5-14b-fullvocab --full-vocab
    M=outputs/models/qwen2.5-14b-fullvocab
    python scripts/repro/capacity_predict.py experiment=capacity_h200_vllm serve.model=$M serve.plan_model=$M/config.json

Arguments are serve-bench overrides (one run, capacity.search set); needs the served model's tokenizer locally.
"""

from __future__ import annotations

import json
import sys

from phase6.config import load_object
from phase6.launch import load_config
from phase6.runrecord import dumps, markdown_table


def main(argv: list[str]) -> int:
    cfg = load_config("serve_bench", argv)
    if cfg.capacity.search is None:
        print("capacity_predict: set capacity.search=rate|concurrency", file=sys.stderr)
        return 2
    from transformers import AutoTokenizer

    probes_cls = load_object("projects/6b_serving/capacity.py:Probes")
    predict = load_object("projects/6b_serving/capacity.py:predict")
    tok = AutoTokenizer.from_pretrained(cfg.serve.tokenizer or cfg.serve.model, trust_remote_code=False)
    pred, _ = predict(cfg, probes_cls(cfg, tok), cfg.serve.model)
    keys = ("load", "planned", "attainment", "ttft_attainment", "tpot_attainment", "goodput_req_s")
    keys += ("throughput_tok_s", "ttft_p99_ms", "tpot_p99_ms")
    print(markdown_table([{k: p.get(k) for k in keys} for p in pred["probes"]]), end="")
    print(json.dumps({k: v for k, v in json.loads(dumps(pred)).items() if k != "probes"}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
