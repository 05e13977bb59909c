"""Secrets never reach logs or saved configs: one redaction rule used by every writer."""

from __future__ import annotations

import re
from typing import Any

REDACTED = "***REDACTED***"
# A key is secret when one of its words is one of these (HF_TOKEN, api_key, WANDB_API_KEY, db_password, ...).
# Words, not substrings: `max_new_tokens` or `tokenizer` are not secrets. "token"/"key" name a rate or a vocabulary
# entry, not a credential, after these words (`flops_per_token`, `eot_token`, `sort_key`).
_SECRET_WORDS = {"token", "key", "secret", "password", "passwd", "apikey", "credentials", "auth"}
_NOT_SECRET_BEFORE = {
    "per",
    "eot",
    "eos",
    "bos",
    "pad",
    "unk",
    "sep",
    "cls",
    "mask",
    "special",
    "sort",
    "hash",
    "cache",
    "first",
    "last",
    "next",
    "start",
    "end",
    "stop",
    "dict",
    "primary",
    "group",
    "shard",
}
# Values that look like credentials wherever they appear (command lines, free text).
_SECRET_VALUE = re.compile(
    r"\b(hf_[A-Za-z0-9]{16,}|sk-[A-Za-z0-9_\-]{16,}|wandb_v1_[A-Za-z0-9_]{16,}|gh[pousr]_[A-Za-z0-9]{20,})\b"
)


def is_secret_key(key: str) -> bool:
    words = [w.lower() for w in re.split(r"[^A-Za-z0-9]+|(?<=[a-z])(?=[A-Z])", str(key)) if w]
    return any(
        w in _SECRET_WORDS and not (i > 0 and words[i - 1] in _NOT_SECRET_BEFORE and w in ("token", "key"))
        for i, w in enumerate(words)
    )


def redact_text(text: str) -> str:
    """Mask credential-shaped substrings and ``KEY=value`` pairs whose key is secret."""
    text = _SECRET_VALUE.sub(REDACTED, text)
    return re.sub(
        r"([A-Za-z0-9_.\-]+)=(\S+)",
        lambda m: f"{m.group(1)}={REDACTED}" if is_secret_key(m.group(1)) else m.group(0),
        text,
    )


def redact(obj: Any) -> Any:
    """Deep copy of dicts/lists with secret-keyed string values (and credential-shaped strings) masked."""
    if isinstance(obj, dict):
        return {k: (REDACTED if is_secret_key(k) and isinstance(v, str) and v else redact(v)) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(redact(v) for v in obj)
    if isinstance(obj, str):
        return redact_text(obj)
    return obj
