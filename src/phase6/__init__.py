"""phase6: experiment pipelines for distributed LLM work on one shared library."""

__version__ = "0.1.0"
