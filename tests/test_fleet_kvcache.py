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


class ReferenceCache:
    """The straightforward version (a list in LRU order, linear scans) the optimized PrefixCache must equal."""

    def __init__(self, capacity: int) -> None:
        self.free, self.ref, self.lru, self.evictions = capacity, {}, [], 0

    def match(self, hid: tuple[int, ...]) -> int:
        m = 0
        while m < len(hid) and hid[m] in self.ref:
            m += 1
        return m

    def acquire(self, hid: tuple[int, ...], hit: int, private: int) -> bool:
        evictable_after_pin = len([b for b in self.lru if b not in hid[:hit]])
        if self.free + evictable_after_pin < private:
            return False
        for b in hid[:hit]:
            if self.ref[b] == 0:
                self.lru.remove(b)
            self.ref[b] += 1
        while self.free < private:
            del self.ref[self.lru.pop(0)]
            self.free += 1
            self.evictions += 1
        self.free -= private
        return True

    def commit(self, hid: tuple[int, ...], hit: int) -> None:
        for b in hid[hit:]:
            if b not in self.ref:
                self.ref[b] = 1
                continue
            if self.ref[b] == 0:
                self.lru.remove(b)
            self.ref[b] += 1
            self.free += 1

    def release(self, hid: tuple[int, ...], private: int) -> None:
        for b in reversed(hid):
            self.ref[b] -= 1
            if self.ref[b] == 0:
                self.lru.append(b)
        self.free += private


def chained_request(rnd: random.Random) -> tuple[int, ...]:
    """Block ids the Mooncake way: a block's id names its whole prefix (a path in a tree of 6 roots, fan-out 3)."""
    ids, parent = [], 0
    for _ in range(rnd.randint(1, 12)):
        parent = parent * 4 + 1 + min(int(rnd.expovariate(1.0)), 2)  # popular children first
        ids.append(parent)
    return tuple(ids)


def test_optimized_cache_equals_reference_on_a_random_trace() -> None:
    """20k random admissions/finishes of chained-prefix requests under eviction pressure: every match, admission
    decision, hit count, eviction count, refcount and the exact LRU order equal the straightforward version."""
    rnd = random.Random(7)
    fast, ref = PrefixCache(40), ReferenceCache(40)
    live: list[tuple[tuple[int, ...], int, int, bool]] = []  # (ids, hit blocks, private blocks, prefill done)
    hits = refused = 0
    for step in range(20_000):
        u = rnd.random()
        if live and u < 0.45:
            k = rnd.randrange(len(live))
            hid, m, priv, done = live[k]
            if not done:  # prefill ends: new prompt blocks become cached
                fast.commit(hid, m)
                ref.commit(hid, m)
                live[k] = (hid, m, priv, True)
            else:
                live.pop(k)
                fast.release(hid, priv - (len(hid) - m))
                ref.release(hid, priv - (len(hid) - m))
        else:
            hid = chained_request(rnd)
            m = fast.match(hid)
            assert m == ref.match(hid), step
            priv = len(hid) - m + rnd.randint(0, 2)
            ok = fast.acquire(hid, m, priv)
            assert ok == ref.acquire(hid, m, priv), step
            if ok:
                live.append((hid, m, priv, False))
                hits += m
            else:
                refused += 1
        assert fast.ref == ref.ref and list(fast.lru) == ref.lru, step
        assert (fast.free, fast.evictions) == (ref.free, ref.evictions), step
        fast.check()
    assert hits > 5000 and fast.evictions > 5000 and refused > 100  # the trace exercised hits, evictions, refusals
