"""WikiExtractor `<doc>` text (shared/data/enwiki-slice) -> JSONL of article bodies, held-out pages first.

    python scripts/enwiki_jsonl.py ../shared/data/enwiki-slice/enwiki_slice.txt.gz data/enwiki-slice/enwiki.jsonl

Drops the `<doc>`/`</doc>` lines, the repeated title line and empty (redirect) pages (PROVENANCE.md of the slice).
The last 5% of pages by bytes (the slice's suggested validation part: pages from "Charles Dunham" on) are written
first, so `phase6 prepare-data`'s val shard (the first data.num_val_tokens tokens) is cut from them and never
trained on; the training pages follow in page-id order.
"""

from __future__ import annotations

import gzip
import json
import re
import sys
from pathlib import Path

DOC = re.compile(r'<doc id="(\d+)" url="[^"]*" title="([^"]*)">\n(.*?)\n</doc>\n', re.DOTALL)
VAL_FRACTION = 0.05


def main(src: str, dst: str) -> None:
    raw = gzip.open(src, "rt", encoding="utf-8").read() if src.endswith(".gz") else Path(src).read_text("utf-8")
    cut = int(len(raw.encode("utf-8")) * (1 - VAL_FRACTION))  # byte offset; the split is at the next page start
    train, val, offset = [], [], 0
    for m in DOC.finditer(raw):
        title, body = m.group(2), m.group(3)
        lines = body.split("\n")
        if lines and lines[0].strip() == title.strip():
            lines = lines[1:]
        text = "\n".join(lines).strip()
        (val if offset >= cut else train).append(text) if text else None
        offset += len(m.group(0).encode("utf-8"))
    out = Path(dst)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", encoding="utf-8") as f:
        for text in val + train:
            f.write(json.dumps({"text": text}, ensure_ascii=False) + "\n")
    print(f"{out}: {len(val)} held-out pages first, then {len(train)} training pages")


if __name__ == "__main__":
    main(*sys.argv[1:3])
