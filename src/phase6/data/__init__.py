"""Data for phase6 jobs: llm.c token shards and their manifest (shards), tokenizers, prep, and loaders."""
