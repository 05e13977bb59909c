"""6A data prep: tokenize a corpus into llm.c shards (shard 0 = val) with manifest.json; a killed prep resumes.

    phase6 prepare-data                                   # CPython's docs, byte tokenizer: offline, ~1 s
    phase6 prepare-data data=fineweb_edu                  # FineWeb-Edu sample-10BT, GPT-2 BPE, 1e8-token shards
    phase6 prepare-data data=fineweb data.revision=<sha>  # FineWeb sample-10BT pinned to a Hub commit
    phase6 prepare-data data=c4_demo                      # 300 real web documents from shared/data, GPT-2 BPE
    phase6 prepare-data data=embedded data.source=local data.local_path=my.jsonl data.out_dir=data/mine
    phase6 prepare-data --check-tokenizer data=c4_demo    # byte-exact round trip of an English page, bytes/token

Rerunning the same command after a kill continues after the last completed shard; rerunning a finished prep
re-verifies the shards (header, token count, sha256 against manifest.json) and changes nothing.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from phase6 import metrics
from phase6.config.data import PrepareDataRunConfig
from phase6.data.prepare import prepare_shards, tokenizer_check, verify
from phase6.data.shards import ShardInfo
from phase6.runrecord import RunRecord
from phase6.timing import wall


def main(cfg: PrepareDataRunConfig) -> Path:
    rec = RunRecord(cfg, "prepare_data")
    if cfg.check_tokenizer:
        check = tokenizer_check(cfg.data, cfg.check_text)
        row = {
            "tokenizer": check.tokenizer,
            "text": check.source,
            "bytes": check.num_bytes,
            "tokens": check.num_tokens,
            "bytes_per_token": check.bytes_per_token,
            "round_trip": "byte-exact",
        }
        return rec.finish([row], notes={"check": "decode(encode(text)) == text compared as UTF-8 bytes"})

    t0 = wall()
    written = {"tokens": 0}
    seen: list[str] = []

    def on_shard(shard: ShardInfo) -> None:
        seen.append(shard.file)
        written["tokens"] += shard.num_tokens
        rate = written["tokens"] / (wall() - t0)
        rec.log({metrics.TOKENS_SEEN: written["tokens"], metrics.TOKENS_PER_S: rate, "shard": len(seen)})

    manifest = prepare_shards(cfg.data, show_progress=cfg.logger.console, on_shard=on_shard)
    seconds = wall() - t0
    if cfg.verify:
        verify(cfg.data.out_dir)
    rows = []
    for split in ("val", "train"):
        shards = [s for s in manifest.shards if s.split == split]
        rows.append(
            {
                "split": split,
                "shards": len(shards),
                "tokens": sum(s.num_tokens for s in shards),
                "first": shards[0].file,
                "last": shards[-1].file,
            }
        )
    measured = {
        "tokens_written_now": written["tokens"],
        "prep_seconds": seconds,
        "tokens_per_s": written["tokens"] / seconds if written["tokens"] else None,
    }
    extra = {"data_dir": str(Path(cfg.data.out_dir).resolve()), "manifest": asdict(manifest)}
    notes = {
        "source": f"{manifest.source} @ {manifest.revision}",
        "tokenizer": f"{manifest.tokenizer.name} (vocab {manifest.tokenizer.vocab_size}, EOT "
        f"{manifest.tokenizer.eot_token} prepended to each of {manifest.num_docs:,} documents)",
        "split": manifest.split_rule,
        "verified": "sha256 of every shard" if cfg.verify else "no",
    }
    return rec.finish(rows, measured=measured, extra=extra, notes=notes)
