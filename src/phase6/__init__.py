"""phase6: experiment pipelines for distributed LLM work on one shared library."""

import logging

__version__ = "0.1.0"

# Where torchao is installed (the fp8/dev extras), transformers imports it with every model class (its quantizer
# registry), so every command loaded it, and torchao's import logged about parts phase6 never uses: its optional
# C/CUDA kernels (mxfp8, cutlass) and Triton int-mm, and torch's deprecation of register_constant on Enums that
# torchao registers. phase6 uses torchao only for model.float8 (phase6.parallel.apply_float8, imported lazily there).
# Exactly those import-time records are dropped; any other warning of these loggers still shows.
_UNUSED_FEATURE_NOTICES = {
    "torchao": ("Failed to load ",),
    "torchao.kernel.intmm": ("Warning: Detected no triton",),
    "torch.utils._pytree": ("is an Enum subclass and is now natively supported by torch.compile",),
}


def _keep(prefixes: tuple[str, ...]) -> logging.Filter:
    class _Drop(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            msg = record.getMessage()
            return not any(p in msg for p in prefixes)

    return _Drop()


for _name, _texts in _UNUSED_FEATURE_NOTICES.items():
    logging.getLogger(_name).addFilter(_keep(_texts))
