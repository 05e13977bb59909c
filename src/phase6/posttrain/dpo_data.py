"""Preference data for 6C: load, convert to TRL's prompt/chosen/rejected form, validate, summarise.

Formats (``data.format``), each converted to TRL's preference schema (plain strings or conversational message lists):

- ``preference``   {"prompt", "chosen", "rejected"}, plain strings or lists of {"role", "content"} messages
                   (trl-lib/ultrafeedback_binarized, trl-lib/hh-rlhf-helpful-base, your own JSON/JSONL).
- ``ultrafeedback`` HuggingFaceH4/ultrafeedback_binarized: "chosen"/"rejected" are full conversations
                   (user + assistant); the longest common message prefix is the prompt.
- ``hh_rlhf``      Anthropic/hh-rlhf: "chosen"/"rejected" are two full "\\n\\nHuman: … \\n\\nAssistant: …" transcripts;
                   the longest common prefix up to the last "\\n\\nAssistant:" is the prompt, the final assistant turns
                   are the responses.
- ``llamafactory`` LLaMA-Factory ranking format: {"conversations": [{"from", "value"}], "chosen": {"from", "value"},
                   "rejected": {"from", "value"}}.

Every row is validated before training: a missing field or an empty response raises one ``ValueError`` naming the file
and the row (0-based), unless ``drop_invalid`` is set, in which case it is counted and dropped. Pairs whose chosen and
rejected responses are identical carry no preference signal and are always dropped and counted.
"""

from __future__ import annotations

import json
import random
import statistics
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from phase6.config.dpo import FORMATS
from phase6.errors import UserError
from phase6.textio import base_suffix, read_text

if TYPE_CHECKING:
    from datasets import Dataset
Message = dict[str, str]
Text = str | list[Message]

_HH_HUMAN = "\n\nHuman:"
_HH_ASSISTANT = "\n\nAssistant:"
_LF_ROLES = {
    "system": "system",
    "human": "user",
    "gpt": "assistant",
    "observation": "tool",
    "function_call": "assistant",
}


class InvalidRow(Exception):
    """One row failed validation; ``reason`` is a short key used for the drop counts."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


@dataclass
class PreferenceSummary:
    """What the validation kept and dropped; lengths are in characters of the response text."""

    source: str
    format: str
    num_rows: int
    num_kept: int
    dropped: dict[str, int] = field(default_factory=dict)
    conversational: bool = False
    chosen_chars_mean: float = 0.0
    rejected_chars_mean: float = 0.0
    chosen_longer_frac: float = 0.0

    def rows(self) -> list[dict[str, Any]]:
        """A small table for results.md."""
        out: list[dict[str, Any]] = [
            {"item": "source", "value": self.source},
            {"item": "format", "value": self.format + (" (conversational)" if self.conversational else " (plain)")},
            {"item": "rows read", "value": self.num_rows},
            {"item": "rows kept", "value": self.num_kept},
        ]
        out += [{"item": f"dropped: {k}", "value": v} for k, v in sorted(self.dropped.items())]
        out += [
            {"item": "chosen chars (mean)", "value": round(self.chosen_chars_mean, 1)},
            {"item": "rejected chars (mean)", "value": round(self.rejected_chars_mean, 1)},
            {"item": "chosen longer than rejected", "value": f"{100 * self.chosen_longer_frac:.1f}%"},
        ]
        return out


# ---------------------------------------------------------------------------------------------------------------------
# reading raw rows


def read_rows(path: str | Path, split: str = "train", data_dir: str | None = None) -> list[dict[str, Any]]:
    """Rows of a local .json (array, or JSON lines) / .jsonl file, or of a hub dataset id (needs network/cache)."""
    p = Path(path)
    suffix = base_suffix(p)  # pairs.jsonl.gz reads as .jsonl
    if suffix in (".json", ".jsonl") or p.exists():
        if not p.is_file():
            raise UserError(f"data.path: {p} is not a file")
        text = read_text(p)
        stripped = text.lstrip()
        if suffix == ".json" and stripped.startswith("["):
            try:
                rows = json.loads(text)
            except json.JSONDecodeError as e:
                raise ValueError(f"{p}: not valid JSON ({e.msg} at line {e.lineno})") from None
            if not all(isinstance(r, dict) for r in rows):
                bad = next(i for i, r in enumerate(rows) if not isinstance(r, dict))
                raise ValueError(f"{p}: row {bad}: expected a JSON object, got {type(rows[bad]).__name__}")
            for i, r in enumerate(rows):
                _check_encodable(r, f"{p}: row {i}")
            return rows
        rows = []
        for lineno, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{p}: line {lineno}: not valid JSON ({e.msg})") from None
            if not isinstance(row, dict):
                raise ValueError(f"{p}: line {lineno}: expected a JSON object, got {type(row).__name__}")
            _check_encodable(row, f"{p}: line {lineno}")
            rows.append(row)
        return rows
    # A hub dataset id; at run time HF_HUB_OFFLINE=1 makes this read the local cache only.
    from datasets import load_dataset

    ds = load_dataset(str(path), data_dir=data_dir, split=split)
    return [dict(r) for r in ds]


def _check_encodable(value: Any, where: str, key: str = "") -> None:
    """JSON's \\ud800-style escapes can spell a lone UTF-16 surrogate, valid JSON but no text: no tokenizer can
    encode it. A ValueError naming the row and the field, before a model is built."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ValueError(
                f"{where}: field {key or '?'}: a lone UTF-16 surrogate {value[e.start]!r} at character {e.start} "
                "(not text; a broken \\u escape in the source)"
            ) from None
    elif isinstance(value, dict):
        for k, v in value.items():
            _check_encodable(v, where, f"{key}.{k}" if key else str(k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _check_encodable(v, where, f"{key}[{i}]")


# ---------------------------------------------------------------------------------------------------------------------
# per-format conversion; each returns {"prompt", "chosen", "rejected"} or raises InvalidRow


def _require(row: dict[str, Any], key: str) -> Any:
    if key not in row or row[key] is None:
        raise InvalidRow("missing field", f"missing field '{key}'")
    return row[key]


def _check_messages(value: Any, key: str) -> list[Message]:
    if not isinstance(value, list) or not value:
        raise InvalidRow("empty response" if key != "prompt" else "empty prompt", f"'{key}' is empty or not a list")
    for j, m in enumerate(value):
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise InvalidRow("bad message", f"'{key}'[{j}] is not a {{'role', 'content'}} message")
        if not isinstance(m["content"], str):
            raise InvalidRow("bad message", f"'{key}'[{j}].content is not a string")
    return [{"role": m["role"], "content": m["content"]} for m in value]


def _text_of(value: Text) -> str:
    return value if isinstance(value, str) else "".join(m["content"] for m in value)


def convert_preference(row: dict[str, Any]) -> dict[str, Text]:
    """prompt/chosen/rejected, all plain strings or all message lists."""
    prompt, chosen, rejected = _require(row, "prompt"), _require(row, "chosen"), _require(row, "rejected")
    if all(isinstance(v, str) for v in (prompt, chosen, rejected)):
        return {"prompt": prompt, "chosen": chosen, "rejected": rejected}
    if all(isinstance(v, list) for v in (prompt, chosen, rejected)):
        return {
            "prompt": _check_messages(prompt, "prompt"),
            "chosen": _check_messages(chosen, "chosen"),
            "rejected": _check_messages(rejected, "rejected"),
        }
    kinds = {k: type(v).__name__ for k, v in (("prompt", prompt), ("chosen", chosen), ("rejected", rejected))}
    raise InvalidRow("mixed types", f"prompt/chosen/rejected must be all strings or all message lists, got {kinds}")


def convert_ultrafeedback(row: dict[str, Any]) -> dict[str, Text]:
    """Full chosen/rejected conversations; the longest common message prefix becomes the prompt."""
    chosen = _check_messages(_require(row, "chosen"), "chosen")
    rejected = _check_messages(_require(row, "rejected"), "rejected")
    n = 0
    while n < min(len(chosen), len(rejected)) - 1 and chosen[n] == rejected[n]:
        n += 1
    if n == 0:
        # No shared turn: the H4 schema also carries the prompt text in "prompt"
        prompt_text = _require(row, "prompt")
        if not isinstance(prompt_text, str):
            raise InvalidRow("missing field", "no shared prompt turn and 'prompt' is not a string")
        return {"prompt": [{"role": "user", "content": prompt_text}], "chosen": chosen, "rejected": rejected}
    return {"prompt": chosen[:n], "chosen": chosen[n:], "rejected": rejected[n:]}


def _hh_messages(transcript: str) -> list[Message]:
    """'\\n\\nHuman: a\\n\\nAssistant: b' -> [{'user', 'a'}, {'assistant', 'b'}]."""
    messages: list[Message] = []
    pos = 0
    while pos < len(transcript):
        if transcript.startswith(_HH_HUMAN, pos):
            role, pos = "user", pos + len(_HH_HUMAN)
        elif transcript.startswith(_HH_ASSISTANT, pos):
            role, pos = "assistant", pos + len(_HH_ASSISTANT)
        else:
            raise InvalidRow("bad transcript", f"text at offset {pos} does not start a Human/Assistant turn")
        nxt = [i for i in (transcript.find(_HH_HUMAN, pos), transcript.find(_HH_ASSISTANT, pos)) if i >= 0]
        end = min(nxt) if nxt else len(transcript)
        messages.append({"role": role, "content": transcript[pos:end].strip()})
        pos = end
    return messages


def split_hh_rlhf(chosen: str, rejected: str) -> tuple[str, str, str]:
    """Split two HH-RLHF transcripts into (prompt, chosen response, rejected response).

    The prompt is the longest common prefix cut back to the end of its last "\\n\\nAssistant:" marker, so that a
    response that starts with the same word in both transcripts is not cut mid-turn.
    """
    n = 0
    limit = min(len(chosen), len(rejected))
    while n < limit and chosen[n] == rejected[n]:
        n += 1
    cut = chosen.rfind(_HH_ASSISTANT, 0, n)  # the marker must lie wholly inside the common prefix
    if cut < 0:
        raise InvalidRow("bad transcript", "the two transcripts share no '\\n\\nAssistant:' turn")
    prompt = chosen[: cut + len(_HH_ASSISTANT)]
    chosen_resp, rejected_resp = chosen[len(prompt) :], rejected[len(prompt) :]
    if _HH_HUMAN in chosen_resp or _HH_HUMAN in rejected_resp:
        raise InvalidRow("diverging transcripts", "the transcripts differ before the final assistant turn")
    return prompt, chosen_resp, rejected_resp


def convert_hh_rlhf(row: dict[str, Any]) -> dict[str, Text]:
    chosen, rejected = _require(row, "chosen"), _require(row, "rejected")
    if not isinstance(chosen, str) or not isinstance(rejected, str):
        raise InvalidRow("bad transcript", "'chosen' and 'rejected' must be transcript strings")
    prompt, chosen_resp, rejected_resp = split_hh_rlhf(chosen, rejected)
    # The prompt ends on the empty assistant marker; the chat template adds its own generation prompt instead.
    prompt_msgs = _hh_messages(prompt[: -len(_HH_ASSISTANT)])
    if not prompt_msgs or prompt_msgs[-1]["role"] != "user":
        raise InvalidRow("bad transcript", "the prompt does not end with a Human turn")
    return {
        "prompt": prompt_msgs,
        "chosen": [{"role": "assistant", "content": chosen_resp.strip()}],
        "rejected": [{"role": "assistant", "content": rejected_resp.strip()}],
    }


def convert_llamafactory(row: dict[str, Any]) -> dict[str, Text]:
    conv = _require(row, "conversations")
    if not isinstance(conv, list) or not conv:
        raise InvalidRow("empty prompt", "'conversations' is empty or not a list")
    prompt: list[Message] = []
    for j, m in enumerate(conv):
        if not isinstance(m, dict) or m.get("from") not in _LF_ROLES or not isinstance(m.get("value"), str):
            raise InvalidRow("bad message", f"'conversations'[{j}] is not a {{'from', 'value'}} turn")
        prompt.append({"role": _LF_ROLES[m["from"]], "content": m["value"]})
    out: dict[str, Text] = {"prompt": prompt}
    for key in ("chosen", "rejected"):
        v = _require(row, key)
        if isinstance(v, str):
            v = {"from": "gpt", "value": v}
        if not isinstance(v, dict) or not isinstance(v.get("value"), str):
            raise InvalidRow("bad message", f"'{key}' is not a {{'from', 'value'}} turn")
        out[key] = [{"role": "assistant", "content": v["value"]}]
    return out


CONVERTERS = {
    "preference": convert_preference,
    "ultrafeedback": convert_ultrafeedback,
    "hh_rlhf": convert_hh_rlhf,
    "llamafactory": convert_llamafactory,
}


def _validate(pair: dict[str, Text]) -> None:
    if not _text_of(pair["prompt"]).strip():
        raise InvalidRow("empty prompt", "empty 'prompt'")
    for key in ("chosen", "rejected"):
        if not _text_of(pair[key]).strip():
            raise InvalidRow("empty response", f"empty '{key}'")


def build_preference_pairs(
    rows: list[dict[str, Any]], fmt: str, source: str, drop_invalid: bool = False
) -> tuple[list[dict[str, Text]], PreferenceSummary]:
    """Convert + validate raw rows; returns the kept pairs and a summary of what was dropped and why."""
    if fmt not in CONVERTERS:
        raise ValueError(f"data.format: {fmt!r} is not one of {list(FORMATS)}")
    convert = CONVERTERS[fmt]
    kept: list[dict[str, Text]] = []
    dropped: Counter[str] = Counter()
    for i, row in enumerate(rows):
        try:
            pair = convert(row)
            _validate(pair)
        except InvalidRow as e:
            if not drop_invalid:
                raise ValueError(
                    f"{source}: row {i}: {e.detail} (format={fmt}; set data.drop_invalid=true to drop such rows)"
                ) from None
            dropped[e.reason] += 1
            continue
        if _text_of(pair["chosen"]).strip() == _text_of(pair["rejected"]).strip():
            dropped["identical chosen/rejected"] += 1
            continue
        kept.append(pair)
    if not kept:
        raise ValueError(f"{source}: no valid preference pairs left after validation (dropped: {dict(dropped)})")
    conversational = isinstance(kept[0]["prompt"], list)
    if any(isinstance(p["prompt"], list) != conversational for p in kept):
        raise ValueError(f"{source}: rows mix plain-text and conversational prompts")
    c_len = [len(_text_of(p["chosen"])) for p in kept]
    r_len = [len(_text_of(p["rejected"])) for p in kept]
    summary = PreferenceSummary(
        source=source,
        format=fmt,
        num_rows=len(rows),
        num_kept=len(kept),
        dropped=dict(dropped),
        conversational=conversational,
        chosen_chars_mean=statistics.fmean(c_len),
        rejected_chars_mean=statistics.fmean(r_len),
        chosen_longer_frac=sum(c > r for c, r in zip(c_len, r_len, strict=True)) / len(kept),
    )
    return kept, summary


@dataclass
class PreferenceSplits:
    """Train / held-out eval pairs; the probe and length-prompt sets are fixed prefixes of the eval split."""

    train: Dataset
    eval: Dataset
    summary: PreferenceSummary


def load_preference_data(
    path: str,
    fmt: str,
    *,
    split: str = "train",
    data_dir: str | None = None,
    drop_invalid: bool = False,
    max_rows: int | None = None,
    eval_size: int = 64,
    seed: int = 0,
) -> PreferenceSplits:
    """Read, convert, validate and split a preference set into train and a fixed held-out eval split."""
    from datasets import Dataset

    rows = read_rows(path, split=split, data_dir=data_dir)
    if max_rows is not None:
        rows = rows[:max_rows]
    pairs, summary = build_preference_pairs(rows, fmt, source=str(path), drop_invalid=drop_invalid)
    if eval_size >= len(pairs):
        raise ValueError(f"data.eval_size: {eval_size} leaves no training pairs ({len(pairs)} valid pairs)")
    order = list(range(len(pairs)))
    random.Random(seed).shuffle(order)
    eval_idx, train_idx = order[:eval_size], order[eval_size:]
    return PreferenceSplits(
        train=Dataset.from_list([pairs[i] for i in train_idx]),
        eval=Dataset.from_list([pairs[i] for i in eval_idx]),
        summary=summary,
    )


_PREFLIGHT: dict[str, PreferenceSplits] = {}


def _data_key(cfg: Any) -> str:
    d = cfg.data
    return repr((d.path, d.format, d.split, d.data_dir, d.drop_invalid, d.max_rows, d.eval_size, cfg.run.seed))


def preflight(cfg: Any) -> None:
    """`phase6 dpo` before anything heavy loads: every preference row validated, the judge endpoint probed."""
    from phase6.evals.judge import probe_judge

    d = cfg.data
    _PREFLIGHT[_data_key(cfg)] = load_preference_data(
        d.path,
        d.format,
        split=d.split,
        data_dir=d.data_dir,
        drop_invalid=d.drop_invalid,
        max_rows=d.max_rows,
        eval_size=d.eval_size,
        seed=cfg.run.seed,
    )
    if cfg.eval.judge.base_url is not None:
        probe_judge(cfg.eval.judge.base_url, cfg.eval.judge.api_key_env)


def preflighted(cfg: Any) -> PreferenceSplits | None:
    """The splits `preflight` already loaded for this config (once), else None."""
    return _PREFLIGHT.pop(_data_key(cfg), None)
