"""Post-training library: preference data, tiny offline models, training diagnostics (6C/6D)."""
