"""Model architectures (plain nn.Modules) and their checkpoint converters."""
