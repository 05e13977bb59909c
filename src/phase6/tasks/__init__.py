"""Verifiable tasks: loaders, prompt templates and reward functions (one module per task)."""
