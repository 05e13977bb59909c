"""Pretraining data: llm.c token shards + manifest (shards), tokenizers, document sources, prep, batch loaders.

    phase6 prepare-data data=fineweb_edu          # -> data/finewebedu10B-gpt2/{finewebedu_val_000000.bin, ...}

    from phase6.data.prepare import ensure_prepared
    from phase6.data.loader import ShardLoader, ValLoader

    manifest = ensure_prepared(cfg.data)          # prep (or finish a killed prep) unless out_dir is ready
    train = ShardLoader(cfg.data.out_dir, "train", B, T, rank, world_size)
    x, y = train.next_batch()                     # (B, T) int64; checkpoint train.state_dict() for exact resume
    val = ValLoader(cfg.data.out_dir, B, T, num_tokens, rank, world_size)

Modules: ``shards`` (format, manifest, validation), ``tokenizer`` (gpt2 / byte / bpe, round-trip check),
``sources`` (embedded CPython docs, local files, HF streaming), ``prepare`` (resumable prep), ``loader``.
"""
