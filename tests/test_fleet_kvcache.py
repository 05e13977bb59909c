"""Per-replica KV block accounting: prefix hits, pinning, LRU eviction order, capacity."""

from __future__ import annotations

import random

from phase6.fleet.kvcache import PrefixCache


def test_hit_pin_commit_release() -> None:
    c = PrefixCache(10)
    assert c.match((1, 2, 3)) == 0
    assert c.acquire((1, 2, 3), 0, 4)  # 3 prompt blocks + 1 output block, all new
    c.commit((1, 2, 3), 0)
    assert c.match((1, 2, 9)) == 2 and c.match((2,)) == 1  # ids name prefixes; leading run only counts from start
    assert c.free == 6 and c.ref == {1: 1, 2: 1, 3: 1}
    c.release((1, 2, 3), 1)  # output block freed, prompt blocks stay cached and become evictable
    assert c.free == 7 and list(c.lru) == [3, 2, 1]  # tail first: the end of a prefix is evicted first
    c.check()


def test_lru_eviction_respects_pins_and_order() -> None:
    c = PrefixCache(4)
    assert c.acquire((1, 2), 0, 2)
    c.commit((1, 2), 0)
    c.release((1, 2), 0)  # evictable: 2 then 1
    assert c.acquire((1,), 1, 3)  # pins 1 (hit), needs 3 new: evicts 2 only
    assert c.evictions == 1 and 2 not in c.ref and c.ref[1] == 1
    assert c.free == 0
    assert not c.acquire((), 0, 1)  # full and nothing evictable: refused without change
    assert c.free == 0 and c.ref[1] == 1
    c.check()


def test_duplicate_commit_shares_block() -> None:
    c = PrefixCache(8)
    assert c.acquire((5, 6), 0, 2) and c.acquire((5, 6), 0, 2)  # two in flight with the same new prompt
    c.commit((5, 6), 0)
    c.commit((5, 6), 0)  # second copy is freed, the cached one shared
    assert c.ref == {5: 2, 6: 2} and c.free == 6
    c.release((5, 6), 0)
    c.release((5, 6), 0)
    assert c.free == 6 and set(c.lru) == {5, 6}
    c.check()


def test_random_operations_keep_invariants() -> None:
    rnd = random.Random(0)
    c = PrefixCache(50)
    live: list[tuple[tuple[int, ...], int, int]] = []
    for step in range(3000):
        if live and (rnd.random() < 0.45 or c.free == 0):
            hid, m, priv = live.pop(rnd.randrange(len(live)))
            c.commit(hid, m)
            c.release(hid, priv - (len(hid) - m))
        else:
            root = rnd.randrange(5)
            hid = tuple(root * 100 + k for k in range(rnd.randint(1, 6)))
            m = c.match(hid)
            priv = len(hid) - m + rnd.randint(0, 3)
            if c.acquire(hid, m, priv):
                live.append((hid, m, priv))
        c.check()
        # conservation: every block is free, cached (pinned or evictable) or private to a live request
        assert c.free + len(c.ref) + sum(p for _, _, p in live) == c.capacity, step
