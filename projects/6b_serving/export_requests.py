"""Write the exact requests a `phase6 serve-bench` run sends as a `vllm bench serve --dataset-name custom` JSONL.

    python projects/6b_serving/export_requests.py outputs/vllm_requests -- \\
        experiment=gpu_h200_vllm load.concurrency=1,16,64

The arguments after ``--`` are serve-bench overrides (a sweep: one file per member, ``c{C}.jsonl``). Each line is
``{"prompt": <text>, "output_tokens": <n>}`` for the *measured* requests in send order (serve-bench's workload
builder with the served model's tokenizer and the run's seed, so the list is the one serve-bench sends; its warm-up
requests are not in the file). vLLM's client then sends the same prompts and lengths with

    vllm bench serve --backend openai-chat --endpoint /v1/chat/completions --dataset-name custom \\
        --dataset-path c16.jsonl --custom-output-len -1 --skip-chat-template --disable-shuffle --num-prompts N \\
        --max-concurrency 16 --request-rate inf --ignore-eos --temperature 0 --num-warmups 16 ...

(``--skip-chat-template``: the server applies the template, as it does for serve-bench's chat requests;
``--custom-output-len -1``: each line's own output length; ``--disable-shuffle``: the file's order). ``index.json``
beside the files lists, per member, the file, request count, warm-up count, the sha256 of the request list as
serve-bench records it, and the mean prompt/output lengths.

``--sglang`` also writes ``sglang_c{C}.jsonl`` for ``python -m sglang.bench_serving --dataset-name custom``, whose
loader takes a two-turn conversation and sets each request's output length to the token count of the second turn
(it has no per-line length field): the answer is ``" the"`` repeated n times, which this tokenizer encodes as exactly n
tokens (checked per line; a tokenizer that does not is an error). SGLang's loader shuffles the lines with its
``--seed``: the same requests, in another order.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "src"))


FILLER = " the"


def sglang_lines(requests: list, tok: object) -> list[str]:
    """One ``{"conversations": [user prompt, answer of exactly output_len tokens]}`` line per request."""
    out = []
    for r in requests:
        answer = FILLER * r.output_len
        n = len(tok.encode(answer))  # what sglang's custom loader counts (add_special_tokens left at its default)
        if n != r.output_len:
            raise ValueError(f"tokenizer encodes {FILLER!r} x {r.output_len} as {n} tokens, not {r.output_len}")
        out.append(json.dumps({"conversations": [{"content": r.prompt}, {"content": answer}]}))
    return out


def main(argv: list[str]) -> int:
    if "--" not in argv:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    i = argv.index("--")
    p = argparse.ArgumentParser(prog="export_requests.py")
    p.add_argument("out", type=Path, help="directory for c{C}.jsonl files and index.json")
    p.add_argument("--sglang", action="store_true", help="also sglang_c{C}.jsonl for sglang.bench_serving")
    a = p.parse_args(argv[:i])
    from transformers import AutoTokenizer

    from phase6.launch import ConfigError, preflight
    from phase6.serving.workload import build_workload

    try:
        cfgs = preflight("serve_bench", argv[i + 1 :], multirun=True)
    except ConfigError as e:
        print(f"export_requests: error: {e}", file=sys.stderr)
        return 2
    a.out.mkdir(parents=True, exist_ok=True)
    index = []
    for cfg in cfgs:
        if cfg.load.concurrency is None:
            print("export_requests: error: load.concurrency: needs closed-loop runs", file=sys.stderr)
            return 2
        tok = AutoTokenizer.from_pretrained(cfg.serve.tokenizer or cfg.serve.model, trust_remote_code=False)
        wl = build_workload(cfg.load, tok, cfg.run.seed, cfg.serve.max_model_len)
        path = a.out / f"c{cfg.load.concurrency}.jsonl"
        lines = [json.dumps({"prompt": r.prompt, "output_tokens": r.output_len}) for r in wl.requests]
        path.write_text("\n".join(lines) + "\n")
        if a.sglang:
            try:
                conv = sglang_lines(wl.requests, tok)
            except ValueError as e:
                print(f"export_requests: error: {e}", file=sys.stderr)
                return 2
            (a.out / f"sglang_c{cfg.load.concurrency}.jsonl").write_text("\n".join(conv) + "\n")
        entry = {
            "file": path.name,
            "concurrency": cfg.load.concurrency,
            "requests": len(wl.requests),
            "warmup": len(wl.warmup),
            "sha256_file": hashlib.sha256(path.read_bytes()).hexdigest(),
            "request_list_sha256": wl.info.get("request_list_sha256"),
            "prompt_len_mean": wl.info.get("prompt_len_mean"),
            "output_len_mean": wl.info.get("output_len_mean"),
        }
        index.append(entry)
        print(json.dumps(entry))
    (a.out / "index.json").write_text(json.dumps(index, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
