"""The one error type for user-caused mistakes: config, data, files, endpoints, traces.

Raised with a message ``<what/where>: <why>`` (the key, file or URL first); the CLI prints it as
``phase6: error: <message>`` and exits 2, with no traceback. It subclasses ValueError, the convention for
input checks across the code base, so ``pytest.raises(ValueError)`` and existing ``except ValueError`` still hold.
"""

from __future__ import annotations

EXIT_USER_ERROR = 2


class UserError(ValueError):
    """A mistake the user can fix (bad config key, corrupt shard, missing trace, dead endpoint): one line, exit 2."""


def one_line(exc: BaseException) -> str:
    """The exception's message on one line (newlines joined), without a traceback."""
    text = " ".join(line.strip() for line in str(exc).strip().splitlines() if line.strip())
    return text or type(exc).__name__
