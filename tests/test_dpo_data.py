"""6C preference data: every format converts to TRL's schema; invalid rows stop with file + row, or are counted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from phase6.posttrain.dpo_data import build_preference_pairs, load_preference_data, read_rows, split_hh_rlhf

# Rows in Anthropic/hh-rlhf's real schema (two full transcripts, leading "\n\nHuman:"), shapes taken from the
# helpful-base split: a multi-turn prompt, responses starting with the same word, an empty rejected reply.
HH_ROWS = [
    {
        "chosen": "\n\nHuman: What are some good vegetables to grow in the shade?\n\nAssistant: Lettuce, spinach and "
        "kale tolerate shade.\n\nHuman: What about tomatoes?\n\nAssistant: Tomatoes need at least six hours of sun.",
        "rejected": "\n\nHuman: What are some good vegetables to grow in the shade?\n\nAssistant: Lettuce, spinach "
        "and kale tolerate shade.\n\nHuman: What about tomatoes?\n\nAssistant: Tomatoes are fine anywhere.",
    },
    {
        "chosen": "\n\nHuman: How do I boil an egg?\n\nAssistant: I would put it in boiling water for 9 minutes.",
        "rejected": "\n\nHuman: How do I boil an egg?\n\nAssistant: I'm not sure.",
    },
]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_hh_rlhf_split_keeps_final_assistant_turns() -> None:
    pairs, summary = build_preference_pairs(HH_ROWS, "hh_rlhf", source="hh")
    assert summary.num_kept == 2 and summary.conversational
    p0 = pairs[0]
    assert [m["role"] for m in p0["prompt"]] == ["user", "assistant", "user"]
    assert p0["prompt"][2]["content"] == "What about tomatoes?"
    assert p0["chosen"] == [{"role": "assistant", "content": "Tomatoes need at least six hours of sun."}]
    assert p0["rejected"] == [{"role": "assistant", "content": "Tomatoes are fine anywhere."}]
    # The character-level common prefix runs into the responses ("I"), the prompt must stop at the marker
    prompt, chosen, rejected = split_hh_rlhf(HH_ROWS[1]["chosen"], HH_ROWS[1]["rejected"])
    assert prompt.endswith("\n\nAssistant:")
    assert chosen == " I would put it in boiling water for 9 minutes." and rejected == " I'm not sure."
    assert pairs[1]["prompt"] == [{"role": "user", "content": "How do I boil an egg?"}]


def test_hh_rlhf_diverging_transcripts_and_empty_reply(tmp_path: Path) -> None:
    diverging = {
        "chosen": "\n\nHuman: Hi\n\nAssistant: Hello!\n\nHuman: Bye\n\nAssistant: Bye!",
        "rejected": "\n\nHuman: Hi\n\nAssistant: Go away.\n\nHuman: Bye\n\nAssistant: Bye!",
    }
    empty = {"chosen": "\n\nHuman: Hi\n\nAssistant: Hello!", "rejected": "\n\nHuman: Hi\n\nAssistant:"}
    path = write_jsonl(tmp_path / "hh.jsonl", [HH_ROWS[0], diverging, empty])
    with pytest.raises(ValueError, match=r"hh\.jsonl: row 1: the transcripts differ before the final assistant turn"):
        load_preference_data(str(path), "hh_rlhf", eval_size=1)
    pairs, summary = build_preference_pairs([HH_ROWS[0], diverging, empty], "hh_rlhf", "hh", drop_invalid=True)
    assert len(pairs) == 1
    assert summary.dropped == {"diverging transcripts": 1, "empty response": 1}


def test_ultrafeedback_h4_schema_common_prefix_is_prompt() -> None:
    row = {
        "prompt": "Name a prime.",
        "prompt_id": "abc",
        "chosen": [{"role": "user", "content": "Name a prime."}, {"role": "assistant", "content": "7"}],
        "rejected": [{"role": "user", "content": "Name a prime."}, {"role": "assistant", "content": "8"}],
        "messages": [],
        "score_chosen": 9.0,
        "score_rejected": 2.0,
    }
    pairs, _ = build_preference_pairs([row], "ultrafeedback", "uf")
    assert pairs[0] == {
        "prompt": [{"role": "user", "content": "Name a prime."}],
        "chosen": [{"role": "assistant", "content": "7"}],
        "rejected": [{"role": "assistant", "content": "8"}],
    }


def test_llamafactory_roles_and_shared_demo_file(shared: Path) -> None:
    row = {
        "conversations": [{"from": "system", "value": "Be brief."}, {"from": "human", "value": "Hi"}],
        "chosen": {"from": "gpt", "value": "Hello."},
        "rejected": {"from": "gpt", "value": "Go away."},
    }
    pairs, _ = build_preference_pairs([row], "llamafactory", "lf")
    assert [m["role"] for m in pairs[0]["prompt"]] == ["system", "user"]
    assert pairs[0]["chosen"] == [{"role": "assistant", "content": "Hello."}]
    demo = shared / "llamafactory-dpo-en-demo" / "dpo_en_demo.json"
    splits = load_preference_data(str(demo), "llamafactory", eval_size=32, seed=0)
    assert splits.summary.num_rows == 300  # PROVENANCE.md: 300 pairs, none identical
    assert len(splits.train) + len(splits.eval) == splits.summary.num_kept == 300
    assert all(r["prompt"][-1]["role"] == "user" for r in splits.eval)


@pytest.mark.parametrize(
    "bad,message",
    [
        ({"prompt": "q", "rejected": "b"}, r"row 1: missing field 'chosen'"),
        ({"prompt": "q", "chosen": "  ", "rejected": "b"}, r"row 1: empty 'chosen'"),
        ({"prompt": "q", "chosen": "a", "rejected": [{"role": "assistant", "content": "b"}]}, r"row 1: .*all strings"),
        ({"prompt": [], "chosen": [], "rejected": []}, r"row 1: 'prompt' is empty"),
    ],
)
def test_invalid_rows_name_file_and_row(tmp_path: Path, bad: dict, message: str) -> None:
    path = write_jsonl(tmp_path / "pairs.jsonl", [{"prompt": "q", "chosen": "a", "rejected": "b"}, bad])
    with pytest.raises(ValueError, match=r"pairs\.jsonl: " + message):
        load_preference_data(str(path), "preference", eval_size=1)


def test_drop_invalid_counts_and_identical_pairs_always_dropped(tmp_path: Path) -> None:
    rows = [
        {"prompt": "q1", "chosen": "a", "rejected": "b"},
        {"prompt": "q2", "chosen": "same", "rejected": "same "},  # identical after strip
        {"prompt": "q3", "chosen": "", "rejected": "b"},
        {"prompt": "q4", "rejected": "b"},
        {"prompt": "q5", "chosen": "c", "rejected": "d"},
        {"prompt": "q6", "chosen": "e", "rejected": "f"},
    ]
    path = write_jsonl(tmp_path / "pairs.jsonl", rows)
    splits = load_preference_data(str(path), "preference", eval_size=1, drop_invalid=True, seed=3)
    s = splits.summary
    assert (s.num_rows, s.num_kept) == (6, 3)
    assert s.dropped == {"identical chosen/rejected": 1, "empty response": 1, "missing field": 1}
    assert len(splits.train) == 2 and len(splits.eval) == 1
    # identical pairs are dropped even without drop_invalid (they carry no preference signal)
    pairs, s2 = build_preference_pairs(rows[:2], "preference", "p")
    assert len(pairs) == 1 and s2.dropped == {"identical chosen/rejected": 1}
    rendered = {r["item"]: r["value"] for r in s.rows()}
    assert rendered["rows kept"] == 3 and rendered["dropped: missing field"] == 1


def test_json_array_and_syntax_errors(tmp_path: Path) -> None:
    arr = tmp_path / "pairs.json"
    arr.write_text(json.dumps([{"prompt": "q", "chosen": "a", "rejected": "b"}] * 2))
    assert len(read_rows(arr)) == 2
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"prompt": "q", "chosen": "a", "rejected": "b"}\n{"prompt": \n')
    with pytest.raises(ValueError, match=r"broken\.jsonl: line 2: not valid JSON"):
        read_rows(broken)
    with pytest.raises(ValueError, match=r"data\.format: 'sharegpt' is not one of"):
        build_preference_pairs([], "sharegpt", "x")
    with pytest.raises(ValueError, match=r"data\.eval_size: 2 leaves no training pairs"):
        load_preference_data(str(arr), "preference", eval_size=2)
