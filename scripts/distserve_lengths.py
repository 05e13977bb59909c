"""Rebuild src/phase6/fleet/distserve_lengths.csv: the (prompt, output) token lengths of DistServe's code-completion
and chatbot requests, for `phase6 fleet experiment=papers` (phase6.fleet.papers).

    python scripts/distserve_lengths.py --humaneval HumanEval.jsonl.gz --sharegpt ShareGPT_V3_unfiltered_cleaned_split.json

Follows DistServe's dataset preparation (LLMServe/DistServe evaluation/2-benchmark-serving/0-prepare-dataset.py,
tokenizer facebook/opt-13b = the GPT-2 BPE with one BOS token prepended, so every count is BPE tokens + 1):
- humaneval: every problem, prompt = its "prompt", output = its "canonical_solution" (pairs >= 2048 dropped);
- sharegpt: conversations with >= 3 turns; prompt = the first k turns joined by newlines, k uniform in
  [1, turns - 1] (seeded), output = turn k; pairs with both < 4 tokens or prompt + output >= 2048 dropped; a seeded
  sample of ``--sharegpt-rows`` of them is written.
The ShareGPT file may be truncated (only whole conversations before the cut are read). Needs tiktoken with the
GPT-2 encoding ("r50k_base") available offline (TIKTOKEN_CACHE_DIR, see shared/data/gpt2-tokenizer/PROVENANCE.md).
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
from pathlib import Path

import tiktoken

OUT = Path(__file__).resolve().parents[1] / "src" / "phase6" / "fleet" / "distserve_lengths.csv"


def opt_len(enc: tiktoken.Encoding, text: str) -> int:
    return len(enc.encode(text, disallowed_special=())) + 1  # + the OPT tokenizer's BOS


def humaneval(path: Path, enc: tiktoken.Encoding) -> list[tuple[int, int]]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    pairs = [(opt_len(enc, r["prompt"]), opt_len(enc, r["canonical_solution"])) for r in rows]
    return [(p, o) for p, o in pairs if p + o < 2048]


def conversations(path: Path) -> list[dict]:
    """Every whole conversation of a ShareGPT JSON array, also of a file cut off mid-way."""
    text = path.read_text()
    dec, i, out = json.JSONDecoder(), text.index("[") + 1, []
    while True:
        while i < len(text) and text[i] in " \n\r\t,":
            i += 1
        try:
            obj, i = dec.raw_decode(text, i)
        except json.JSONDecodeError:
            return out
        out.append(obj)


def sharegpt(path: Path, enc: tiktoken.Encoding, rows: int, seed: int) -> tuple[list[tuple[int, int]], int, int]:
    rng = random.Random(seed)
    convs = conversations(path)
    pairs = []
    for d in convs:
        turns = d["conversations"]
        if len(turns) < 3:
            continue
        k = rng.randint(1, len(turns) - 1)
        p = opt_len(enc, "\n".join(t["value"] for t in turns[:k]))
        o = opt_len(enc, turns[k]["value"])
        if (p < 4 and o < 4) or p + o >= 2048:
            continue
        pairs.append((p, o))
    return rng.sample(pairs, min(rows, len(pairs))), len(convs), len(pairs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--humaneval", type=Path, required=True)
    ap.add_argument("--sharegpt", type=Path, required=True)
    ap.add_argument("--sharegpt-rows", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    enc = tiktoken.get_encoding("r50k_base")
    he = humaneval(a.humaneval, enc)
    sg, n_conv, n_kept = sharegpt(a.sharegpt, enc, a.sharegpt_rows, a.seed)
    lines = ["dataset,prompt,output"] + [f"humaneval,{p},{o}" for p, o in he] + [f"sharegpt,{p},{o}" for p, o in sg]
    OUT.write_text("\n".join(lines) + "\n")
    for name, rows in (("humaneval", he), ("sharegpt", sg)):
        mp = sum(p for p, _ in rows) / len(rows)
        mo = sum(o for _, o in rows) / len(rows)
        print(f"{name}: {len(rows)} rows, mean prompt {mp:.1f}, mean output {mo:.1f}")
    print(f"sharegpt: {n_conv} conversations read, {n_kept} requests kept, {len(sg)} sampled -> {OUT}")


if __name__ == "__main__":
    main()
