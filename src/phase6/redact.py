"""Secrets never reach logs or saved configs: one redaction rule used by every writer."""

from __future__ import annotations

import logging
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


# Environment-style names (all capitals): *_KEY, *TOKEN* (not TOKENIZER*), *SECRET*, *PASSW*, *CREDENTIAL*, *AUTH*,
# also when glued together (GITHUBTOKEN, MYAPPSECRET).
_ENV_SECRET = re.compile(r"(^|_)(API)?KEY$|TOKEN(?!IZER)|SECRET|PASSW|CREDENTIAL|(^|_)AUTH")
_FLAG = re.compile(r"^--?([A-Za-z][A-Za-z0-9_.\-]*)$")
# Values of secret keys seen by `redact` in this process (>= 6 characters): masked wherever they reappear in free
# text, e.g. an engine echoing its own arguments into server.log.
_KNOWN: set[str] = set()
_MIN_KNOWN = 6


def is_secret_key(key: str) -> bool:
    key = str(key).lstrip("-+")
    if key.isupper() and _ENV_SECRET.search(key):
        return True
    words = [w.lower() for w in re.split(r"[^A-Za-z0-9]+|(?<=[a-z])(?=[A-Z])", key) if w]
    return any(
        w in _SECRET_WORDS and not (i > 0 and words[i - 1] in _NOT_SECRET_BEFORE and w in ("token", "key"))
        for i, w in enumerate(words)
    )


def register_secret(value: Any) -> None:
    """Remember a secret value so that `redact_text` masks it in any text written later in this process."""
    # not an environment variable's *name* (judge.api_key_env: OPENAI_API_KEY), which errors must still show
    if isinstance(value, str) and len(value) >= _MIN_KNOWN and not re.fullmatch(r"[A-Z][A-Z0-9_]*", value):
        _KNOWN.add(value)


def _mask_pair(m: re.Match[str]) -> str:
    key, sep, value = m.group(1), m.group(2), m.group(3)
    if not is_secret_key(key) or value == REDACTED:
        return m.group(0)
    register_secret(value.strip("'\""))
    return f"{key}{sep}{REDACTED}"


def redact_text(text: str) -> str:
    """Mask, in free text (command lines, log lines): known secret values, credential-shaped substrings,
    ``KEY=value`` / ``--flag=value`` / ``--flag value`` / ``'key': 'value'`` whose key or flag is secret."""
    for value in sorted(_KNOWN, key=len, reverse=True):
        text = text.replace(value, REDACTED)
    text = _SECRET_VALUE.sub(REDACTED, text)
    text = re.sub(r"([A-Za-z0-9_.\-]+)(=)(\S+)", _mask_pair, text)  # KEY=value, --api-key=value
    text = re.sub(r"(?<!\S)(--?[A-Za-z][A-Za-z0-9_.\-]*)(\s+)([^\s\-]\S*)", _mask_pair, text)  # --api-key value
    text = re.sub(r"""(?<=['"])([A-Za-z0-9_.\-]+)(['"]\s*:\s*)('[^']*'|"[^"]*")""", _mask_pair, text)  # 'k': 'v'
    for value in sorted(_KNOWN, key=len, reverse=True):  # values first seen in this very text
        text = text.replace(value, REDACTED)
    return text


class RedactFilter(logging.Filter):
    """A logging filter that writes every record's message through `redact_text` (log files Hydra and we open)."""

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        clean = redact_text(msg)
        if clean != msg:
            record.msg, record.args = clean, None
        return True


def redact_logging() -> None:
    """Put `RedactFilter` on every handler of the root logger (once)."""
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, RedactFilter) for f in handler.filters):
            handler.addFilter(RedactFilter())


def redact_argv(argv: list[str] | tuple[str, ...]) -> list[str]:
    """A command line with secret flag values masked: ``['--api-key', 'v']``, ``--api-key=v``, ``HF_TOKEN=v``."""
    out: list[str] = []
    for i, arg in enumerate(argv):
        prev = _FLAG.match(argv[i - 1]) if i > 0 and isinstance(argv[i - 1], str) else None
        if prev is not None and is_secret_key(prev.group(1)) and not str(arg).startswith("-"):
            register_secret(arg)
            out.append(REDACTED)
        else:
            out.append(redact_text(str(arg)))
    return out


def redact(obj: Any) -> Any:
    """Deep copy of dicts/lists with secret-keyed string values, secret flags' values in argument lists
    (``[..., '--api-key', 'v']``) and credential-shaped strings masked."""
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            if is_secret_key(k) and isinstance(v, str) and v:
                register_secret(v)
                out[k] = REDACTED
            else:
                out[k] = redact(v)
        return out
    if isinstance(obj, (list, tuple)):
        if any(isinstance(v, str) and _FLAG.match(v) for v in obj) and all(isinstance(v, str) for v in obj):
            return type(obj)(redact_argv(list(obj)))
        return type(obj)(redact(v) for v in obj)
    if isinstance(obj, str):
        return redact_text(obj)
    return obj


class RedactingStream:
    """A text stream (sys.stdout / sys.stderr) whose every write goes through `redact_text` first; the rest of the
    stream's interface is the wrapped one's."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        self._stream.write(redact_text(text) if isinstance(text, str) else text)
        return len(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)
