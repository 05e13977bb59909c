"""Per-replica KV cache in 512-token blocks: private blocks of running requests plus a prefix cache with LRU eviction.

Model (vLLM's automatic prefix caching at Mooncake's 512-token granularity):
- A block id names a whole prefix (chained hash), so a request reuses the longest run of *leading* ids present.
- Cached blocks are reference counted; a block no running request uses sits in an LRU list and is evicted only when
  a new allocation needs room. Released blocks enter the LRU tail-first (vLLM frees in reverse order) so the end of
  a prefix is evicted before its beginning.
- A request's new prompt blocks are private while it prefills and become cached blocks when prefill completes.
"""

from __future__ import annotations

from collections import OrderedDict


class PrefixCache:
    """Block accounting of one replica; every count is in blocks."""

    __slots__ = ("capacity", "free", "ref", "lru", "index", "rid", "evictions")

    def __init__(self, capacity: int, index: dict[int, set[int]] | None = None, rid: int = 0) -> None:
        assert capacity >= 1
        self.capacity = capacity
        self.free = capacity
        """Blocks holding nothing."""
        self.ref: dict[int, int] = {}
        """Cached block id -> number of running requests using it (0 = evictable, then also in lru)."""
        self.lru: OrderedDict[int, None] = OrderedDict()
        """Evictable cached blocks, least recently released first."""
        self.index, self.rid = index, rid
        """Optional fleet-wide map block id -> replicas caching it (for the prefix-aware router), kept in sync."""
        self.evictions = 0

    def match(self, hash_ids: tuple[int, ...]) -> int:
        """Number of leading blocks of ``hash_ids`` that are cached."""
        ref = self.ref
        m = 0
        for b in hash_ids:
            if b not in ref:
                break
            m += 1
        return m

    def acquire(self, hash_ids: tuple[int, ...], hit: int, private: int) -> bool:
        """Pin the first ``hit`` cached blocks and allocate ``private`` new ones (evicting LRU blocks).

        Returns False and changes nothing when the blocks do not fit.
        """
        ref, lru = self.ref, self.lru
        # Fast sufficient check (as if every hit block were evictable), exact count only when it is tight.
        if self.free + len(lru) - hit < private:
            pinned_evictable = sum(1 for b in hash_ids[:hit] if ref[b] == 0)
            if self.free + len(lru) - pinned_evictable < private:
                return False
        for b in hash_ids[:hit]:
            if ref[b] == 0:
                del lru[b]
            ref[b] += 1
        if self.free < private:
            index, rid = self.index, self.rid
            n = private - self.free
            for _ in range(n):
                b, _ = lru.popitem(last=False)
                del ref[b]
                if index is not None:
                    s = index[b]
                    s.discard(rid)
                    if not s:
                        del index[b]
            self.free += n
            self.evictions += n
        self.free -= private
        return True

    def commit(self, hash_ids: tuple[int, ...], hit: int) -> None:
        """Prefill done: the request's private prompt blocks ``hash_ids[hit:]`` become cached (pinned) blocks.

        If another request cached the same id meanwhile, that copy is shared and ours is freed.
        """
        ref, lru, index, rid = self.ref, self.lru, self.index, self.rid
        for b in hash_ids[hit:]:
            c = ref.get(b)
            if c is None:
                ref[b] = 1
                if index is not None:
                    s = index.get(b)
                    if s is None:
                        index[b] = {rid}
                    else:
                        s.add(rid)
            else:
                if c == 0:
                    del lru[b]
                ref[b] = c + 1
                self.free += 1

    def release(self, hash_ids: tuple[int, ...], private: int) -> None:
        """The request finished: unpin its cached prompt blocks (tail first into the LRU), free ``private`` blocks."""
        ref, lru = self.ref, self.lru
        for b in reversed(hash_ids):
            c = ref[b] - 1
            ref[b] = c
            if c == 0:
                lru[b] = None
        self.free += private

    @property
    def used(self) -> int:
        """Blocks holding KV: private blocks plus cached blocks (pinned or evictable)."""
        return self.capacity - self.free

    def check(self) -> None:
        """Internal invariants (tests): evictable == refcount 0, nothing over capacity."""
        assert self.free >= 0 and len(self.ref) <= self.capacity - self.free, (self.free, len(self.ref))
        assert all((c == 0) == (b in self.lru) for b, c in self.ref.items())
        assert all(c >= 0 for c in self.ref.values())
