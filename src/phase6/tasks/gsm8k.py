"""GSM8K (``openai/gsm8k``, config ``main``): loader, prompt template, answer extraction, rewards and pass@k.

Conventions (../shared/reference/anchors-6c-6d-posttrain.md §5):

- Every reference answer ends in ``#### N``; N may carry thousands separators (``#### 1,080``).
- The prompt is verl's: the question, then ``Let's think step by step and output the final answer after "####".``,
  sent as one user message so the model's chat template is applied by TRL (or by our engine for eval).
- ``score`` is *flexible*: the completion's final answer is the first number after its last ``####``; without a
  ``####`` line, the content of the last ``\\boxed{}``; otherwise the last number in the text (lm-eval's
  ``flexible-extract`` idea). ``score_strict`` accepts only the ``####`` form (verl's / lm-eval's ``strict-match``).
  Report both: most of a strict gain can be format learning, not arithmetic.
- Numbers compare as decimals: ``18`` = ``18.0`` = ``18.00`` = ``$18`` = ``18 dollars`` = ``1,8``-free ``18.``;
  ``-5`` and ``−5`` (U+2212) are negative; non-ASCII decimal digits (``١٨``, ``１８``) are read as their values.

Extraction is linear in the completion length and never raises: it uses ``str.rfind`` and one regex search over the
reversed string (the *last* number is the first match from the end), and numbers longer than ``MAX_NUMBER_CHARS`` are
rejected before any conversion (a 1 MB run of digits is not an answer).
"""

from __future__ import annotations

import json
import math
import random
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

from phase6.textio import base_suffix, open_text, read_text

PROMPT_SUFFIX = 'Let\'s think step by step and output the final answer after "####".'
HUB_ID = "openai/gsm8k"
MAX_NUMBER_CHARS = 64
"""Longer digit runs are not answers (GSM8K answers have at most 9 digits); bounds the cost of Decimal()."""
STRICT_WINDOW = 200
"""Characters after the last ``####`` that are searched for the strict answer (the rest of that line)."""
MIN_REASONING_WORDS = 5
"""Fewer words than this before the final answer counts as 'no reasoning' in the reward-hacking monitor."""

Message = dict[str, str]

# A number read forwards: optional sign (not glued to a word: '3-5' is 3 and 5), optional '$', digits with
# thousands commas, optional decimals. \d is Unicode-aware (category Nd); digits are mapped to ASCII afterwards.
_NUM_FWD = re.compile(r"(?:(?<!\w)[-−])?\$?\d[\d,]*(?:\.\d+)?")
# The same number written backwards, so that the first match in the reversed text is the last number of the text.
# It is matched at the first digit found by _DIGIT (a plain class scan), not searched: an optional leading group
# would make re try every position of a 1 MB digit-free string.
_NUM_REV = re.compile(r"(?:\d+\.)?[\d,]*\d\$?(?:[-−](?!\w))?")
_DIGIT = re.compile(r"\d")
_BOXED = "\\boxed{"


def build_prompt(question: str) -> list[Message]:
    """The conversational prompt: one user message, question + the final-answer instruction."""
    return [{"role": "user", "content": f"{question.strip()}\n{PROMPT_SUFFIX}"}]


def _to_decimal(raw: str) -> Decimal | None:
    """'$-1,234.50' -> Decimal('-1234.50'); None when it is not a bounded, well-formed number."""
    text = raw.replace("$", "").replace(",", "").replace("−", "-")
    if not text or len(text) > MAX_NUMBER_CHARS:
        return None
    if not text.isascii():
        chars = []
        for ch in text:
            value = unicodedata.decimal(ch, None)
            chars.append(ch if value is None else str(value))
        text = "".join(chars)
    try:
        value = Decimal(text)
    except InvalidOperation:
        return None
    return value if value.is_finite() else None


def _canonical(value: Decimal) -> str:
    """Decimal -> canonical text: 18.00 -> '18', -0.50 -> '-0.5', 1E+2 -> '100'."""
    text = format(value.normalize(), "f")
    return "0" if text in ("-0", "0") else text


def _strict(text: str) -> str | None:
    idx = text.rfind("####")
    if idx < 0:
        return None
    tail = text[idx + 4 : idx + 4 + STRICT_WINDOW].split("\n", 1)[0]
    match = _NUM_FWD.search(tail)
    if match is None:
        return None
    value = _to_decimal(match.group(0))
    return None if value is None else _canonical(value)


def _boxed(text: str) -> str | None:
    idx = text.rfind(_BOXED)
    if idx < 0:
        return None
    end = text.find("}", idx + len(_BOXED), idx + len(_BOXED) + STRICT_WINDOW)
    if end < 0:
        return None
    match = _NUM_FWD.search(text, idx + len(_BOXED), end)
    if match is None:
        return None
    value = _to_decimal(match.group(0))
    return None if value is None else _canonical(value)


def _last_number(text: str) -> str | None:
    reversed_text = text[::-1]
    first_digit = _DIGIT.search(reversed_text)
    if first_digit is None:
        return None
    match = _NUM_REV.match(reversed_text, first_digit.start())
    assert match is not None, "a digit always starts a reversed number"
    value = _to_decimal(match.group(0)[::-1].strip(","))
    return None if value is None else _canonical(value)


def extract_answer(completion: str, strict: bool = False) -> str | None:
    """The completion's final answer as canonical number text, or None. Never raises (non-str input -> None)."""
    if not isinstance(completion, str):
        return None
    answer = _strict(completion)
    if answer is not None or strict:
        return answer
    answer = _boxed(completion)
    return answer if answer is not None else _last_number(completion)


def reference_answer(reference: str) -> str | None:
    """The gold number of a GSM8K answer ('... #### 1,080' -> '1080'), or of a bare number ('72')."""
    if not isinstance(reference, str):
        return None
    return _strict(reference) if "####" in reference else _last_number(reference)


def score(completion: str, reference: str) -> float:
    """1.0 when the completion's final answer (flexible extraction) equals the reference's number, else 0.0."""
    gold = reference_answer(reference)
    return float(gold is not None and extract_answer(completion) == gold)


def score_strict(completion: str, reference: str) -> float:
    """1.0 only when the completion ends its work with ``#### N`` and N equals the reference's number."""
    gold = reference_answer(reference)
    return float(gold is not None and extract_answer(completion, strict=True) == gold)


def has_answer_format(completion: str) -> bool:
    """The requested format is present: a ``####`` followed by a readable number."""
    return isinstance(completion, str) and _strict(completion) is not None


def reasoning_words(completion: str) -> int:
    """Words written before the final answer marker (``####`` or ``\\boxed``); the whole text if neither is there."""
    if not isinstance(completion, str):
        return 0
    cut = completion.rfind("####")
    if cut < 0:
        cut = completion.rfind(_BOXED)
    return len((completion if cut < 0 else completion[:cut]).split())


def completion_text(completion: str | list[Message]) -> str:
    """TRL passes plain strings (standard format) or a list of messages (conversational); return the text."""
    if isinstance(completion, str):
        return completion
    return "".join(m.get("content", "") for m in completion if isinstance(m, dict))


def correctness_reward(completions: list[Any], solution: list[str], **kwargs: Any) -> list[float]:
    """TRL reward function: ``score`` of each completion against its row's ``solution`` column."""
    return [score(completion_text(c), s) for c, s in zip(completions, solution, strict=True)]


def format_reward(completions: list[Any], **kwargs: Any) -> list[float]:
    """TRL reward function (optional): 1.0 when the ``#### N`` format is present, whatever N is."""
    return [float(has_answer_format(completion_text(c))) for c in completions]


def gated_format_reward(completions: list[Any], solution: list[str], **kwargs: Any) -> list[float]:
    """TRL reward function (the defense against format farming): the format bonus is paid only with a correct answer."""
    return [
        float(has_answer_format(t) and score(t, s) == 1.0)
        for t, s in ((completion_text(c), s) for c, s in zip(completions, solution, strict=True))
    ]


def pass_at_k(num_samples: int, num_correct: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct (Chen et al. 2021, eq. 1): 1 - C(n-c, k) / C(n, k)."""
    if not 1 <= k <= num_samples or not 0 <= num_correct <= num_samples:
        raise ValueError(f"pass_at_k needs 1 <= k <= n and 0 <= c <= n, got n={num_samples} c={num_correct} k={k}")
    if num_samples - num_correct < k:
        return 1.0
    return 1.0 - math.comb(num_samples - num_correct, k) / math.comb(num_samples, k)


@dataclass(frozen=True)
class Gsm8kRow:
    """One validated GSM8K example."""

    question: str
    answer: str
    """The worked solution, ending in ``#### N``."""
    solution: str
    """The canonical gold number (commas removed), the reward functions' ``solution`` column."""

    def to_trl(self) -> dict[str, Any]:
        """The row as TRL's GRPOTrainer reads it: conversational ``prompt`` plus columns passed to the rewards."""
        return {"prompt": build_prompt(self.question), "solution": self.solution, "answer": self.answer}


def _validate(raw: Any, where: str) -> Gsm8kRow:
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: expected an object with 'question' and 'answer', got {type(raw).__name__}")
    for key in ("question", "answer"):
        if not isinstance(raw.get(key), str) or not raw[key].strip():
            raise ValueError(f"{where}: key {key!r} must be a non-empty string")
    solution = _strict(raw["answer"])
    if solution is None:
        raise ValueError(f"{where}: key 'answer' must end in '#### N' with a number N, got ...{raw['answer'][-40:]!r}")
    return Gsm8kRow(question=raw["question"], answer=raw["answer"], solution=solution)


def _read_local(path: Path) -> list[Any]:
    suffix = base_suffix(path)  # train.jsonl.gz reads as .jsonl
    if suffix == ".jsonl":
        rows = []
        with open_text(path) as f:
            for i, line in enumerate(f):
                if line.strip():
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError as e:
                        raise ValueError(f"{path}: row {i}: not valid JSON ({e.msg})") from None
        return rows
    if suffix == ".json":
        data = json.loads(read_text(path))
        if not isinstance(data, list):
            raise ValueError(f"{path}: expected a JSON list of rows")
        return data
    if path.suffix == ".parquet":
        from datasets import Dataset

        return list(Dataset.from_parquet(str(path)))
    raise ValueError(f"{path}: unsupported file type {path.suffix!r}; use .jsonl, .json or .parquet")


def load_gsm8k(source: str, split: str = "train", limit: int | None = None) -> list[Gsm8kRow]:
    """Load and validate GSM8K ``main`` rows.

    ``source`` is a file (``.jsonl``/``.json``/``.parquet``), a directory holding ``<split>.jsonl`` (the official
    release layout, e.g. ../shared/data/gsm8k) or ``<split>.parquet``, or a hub dataset id (``openai/gsm8k``; config
    ``main``). A bad row raises one ValueError naming the file and the row index.
    """
    path = Path(source).expanduser()
    if path.is_dir():
        candidates = [path / f"{split}.jsonl", path / f"{split}.jsonl.gz", path / f"{split}.parquet"]
        candidates += [path / "main" / f"{split}.parquet"]
        found = [c for c in candidates if c.exists()]
        if not found:
            raise ValueError(f"{path}: no {split}.jsonl or {split}.parquet for split {split!r}")
        path = found[0]
    if path.exists():
        raw_rows = _read_local(path)
        where = str(path)
    elif "/" in source and not source.startswith((".", "/", "~")):
        from datasets import load_dataset

        raw_rows = list(load_dataset(source, "main", split=split))
        where = f"{source}[main/{split}]"
    else:
        raise ValueError(f"data.path: {source!r} is neither an existing file/directory nor a hub id like {HUB_ID!r}")
    if limit is not None:
        raw_rows = raw_rows[:limit]
    if not raw_rows:
        raise ValueError(f"{where}: no rows")
    return [_validate(r, f"{where}: row {i}") for i, r in enumerate(raw_rows)]


_NAMES = ("Ava", "Ben", "Chen", "Dana", "Eli", "Fatima", "Goran", "Hana")
_ITEMS = ("apples", "marbles", "stickers", "books", "coins", "pencils")


def synthetic_rows(num_rows: int, seed: int = 0) -> list[Gsm8kRow]:
    """GSM8K-schema word problems generated offline (two-step +, -, x), for tests and smoke runs without data files."""
    rng = random.Random(seed)
    rows = []
    for _ in range(num_rows):
        name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
        a, b, c = rng.randint(2, 40), rng.randint(2, 40), rng.randint(2, 6)
        total = (a + b) * c
        question = f"{name} has {a} {item} and buys {b} more. Then {name} gets {c} times as many. How many {item} now?"
        answer = f"{a}+{b} = <<{a}+{b}={a + b}>>{a + b}\n{a + b}*{c} = <<{a + b}*{c}={total}>>{total}\n#### {total:,}"
        rows.append(_validate({"question": question, "answer": answer}, "synthetic"))
    return rows


def write_jsonl(rows: Sequence[Gsm8kRow], path: str | Path) -> Path:
    """Write rows in the official release schema ({"question", "answer"} per line)."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps({"question": r.question, "answer": r.answer}) + "\n")
    return out
