"""MT-Bench-style pairwise judging through any OpenAI-compatible ``/chat/completions`` endpoint.

Each prompt is judged twice with the two answers swapped (MT-Bench's position-bias control); an answer wins only when
both orders agree, otherwise the pair is a tie. The prompt and the ``[[A]]``/``[[B]]``/``[[C]]`` verdict format follow
FastChat's ``pair-v2`` judge prompt. The API key is read from the environment variable named in the config and is
never logged or written.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx

SYSTEM_PROMPT = (
    "Please act as an impartial judge and evaluate the quality of the responses provided by two AI assistants to the "
    "user question displayed below. You should choose the assistant that follows the user's instructions and answers "
    "the user's question better. Your evaluation should consider factors such as the helpfulness, relevance, accuracy, "
    "depth, creativity, and level of detail of their responses. Begin your evaluation by comparing the two responses "
    "and provide a short explanation. Avoid any position biases and ensure that the order in which the responses were "
    "presented does not influence your decision. Do not allow the length of the responses to influence your "
    "evaluation. Do not favor certain names of the assistants. Be as objective as possible. After providing your "
    'explanation, output your final verdict by strictly following this format: "[[A]]" if assistant A is better, '
    '"[[B]]" if assistant B is better, and "[[C]]" for a tie.'
)
USER_TEMPLATE = (
    "[User Question]\n{question}\n\n[The Start of Assistant A's Answer]\n{answer_a}\n[The End of Assistant A's Answer]"
    "\n\n[The Start of Assistant B's Answer]\n{answer_b}\n[The End of Assistant B's Answer]"
)
_VERDICT = re.compile(r"\[\[([ABC])\]\]")


@dataclass
class JudgeResult:
    wins: int
    ties: int
    losses: int
    errors: int
    """Prompts where a judge reply had no parseable verdict; excluded from the win rate."""

    @property
    def n(self) -> int:
        return self.wins + self.ties + self.losses

    @property
    def win_rate(self) -> float:
        """(wins + ties/2) / judged, the usual pairwise win rate of 'after' over 'before'."""
        return (self.wins + 0.5 * self.ties) / self.n if self.n else float("nan")

    def rows(self) -> list[dict[str, Any]]:
        return [
            {"after vs before": "wins", "count": self.wins},
            {"after vs before": "ties", "count": self.ties},
            {"after vs before": "losses", "count": self.losses},
            {"after vs before": "unparseable judge replies", "count": self.errors},
            {"after vs before": "win rate", "count": f"{100 * self.win_rate:.1f}%"},
        ]


def parse_verdict(text: str) -> str | None:
    """'A', 'B', 'C' from the last [[X]] in the judge's reply, or None."""
    found = _VERDICT.findall(text)
    return found[-1] if found else None


def _ask(client: httpx.Client, model: str, question: str, a: str, b: str, max_tokens: int) -> str | None:
    r = client.post(
        "/chat/completions",
        json={
            "model": model,
            "temperature": 0.0,
            "max_tokens": max_tokens,
            "messages": [
                {"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": USER_TEMPLATE.format(question=question, answer_a=a, answer_b=b)},
            ],
        },
    )
    r.raise_for_status()
    return parse_verdict(r.json()["choices"][0]["message"]["content"])


def probe_judge(base_url: str, api_key_env: str | None = None, timeout_s: float = 10.0) -> None:
    """Before training: the judge endpoint answers and, with a key, accepts it; else a one-line UserError."""
    from phase6.errors import UserError

    headers = {}
    if api_key_env:
        key = os.environ.get(api_key_env)
        if not key:
            raise UserError(f"eval.judge.api_key_env: environment variable {api_key_env} is not set")
        headers["Authorization"] = f"Bearer {key}"
    url = base_url.rstrip("/") + "/models"
    try:
        r = httpx.get(url, headers=headers, timeout=timeout_s, trust_env=False)
    except httpx.HTTPError as e:
        raise UserError(f"eval.judge.base_url: {base_url} is unreachable ({type(e).__name__}: {e})") from None
    if r.status_code in (401, 403):
        raise UserError(f"eval.judge.base_url: {url} refused the key in ${api_key_env} (HTTP {r.status_code})")


def judge_pairwise(
    questions: Sequence[str],
    before: Sequence[str],
    after: Sequence[str],
    *,
    base_url: str,
    model: str,
    api_key_env: str | None = None,
    max_tokens: int = 512,
    timeout_s: float = 120.0,
    transport: httpx.BaseTransport | None = None,
) -> JudgeResult:
    """Judge ``after`` against ``before`` on each question, in both orders."""
    if not (len(questions) == len(before) == len(after)):
        raise ValueError("judge: questions, before and after answers must have the same length")
    headers = {}
    if api_key_env:
        key = os.environ.get(api_key_env)
        if not key:
            raise ValueError(f"judge.api_key_env: environment variable {api_key_env} is not set")
        headers["Authorization"] = f"Bearer {key}"
    wins = ties = losses = errors = 0
    with httpx.Client(base_url=base_url.rstrip("/"), headers=headers, timeout=timeout_s, transport=transport) as c:
        for q, b, a in zip(questions, before, after, strict=True):
            first = _ask(c, model, q, a, b, max_tokens)  # after = A
            second = _ask(c, model, q, b, a, max_tokens)  # after = B
            if first is None or second is None:
                errors += 1
                continue
            after_first = {"A": 1, "B": -1, "C": 0}[first]
            after_second = {"A": -1, "B": 1, "C": 0}[second]
            if after_first == after_second == 1:
                wins += 1
            elif after_first == after_second == -1:
                losses += 1
            else:
                ties += 1
    return JudgeResult(wins=wins, ties=ties, losses=losses, errors=errors)
