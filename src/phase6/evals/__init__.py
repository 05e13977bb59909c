"""Evaluation library: lm-eval regression battery, pairwise judge, verdicts."""
