"""Per-replica KV cache in 512-token blocks: private blocks of running requests plus a prefix cache with LRU eviction.

Model (vLLM's automatic prefix caching at Mooncake's 512-token granularity):
- A block id names a whole prefix (chained hash), so a request reuses the longest run of *leading* ids present.
- Cached blocks are reference counted; a block no running request uses sits in an LRU list and is evicted only when
  a new allocation needs room. Released blocks enter the LRU tail-first (vLLM frees in reverse order) so the end of
  a prefix is evicted before its beginning.
- A request's new prompt blocks are private while it prefills and become cached blocks when prefill completes.

Data structures (O(1) per block touched): ``ref`` is a dict block id -> reference count (the set of cached blocks);
``lru`` holds the evictable ones in a plain dict, whose iteration order is insertion order (a block released again
goes to the back): append and delete-from-the-middle are O(1), and an admission that must evict n blocks takes the
first n keys in one pass (``islice``). A plain dict instead of an OrderedDict: its inserts cost a third, and the one
scan per admission skips the deleted slots at the front (compacted whenever CPython resizes the table). The prefix-aware router asks each replica holding a request's first
block for :meth:`PrefixCache.match`; a fleet-wide index is not needed (few replicas hold any given first block, and
keeping an index in sync cost more than it saved: docs/fleet.md, "Event loop").
"""

from __future__ import annotations

from itertools import islice, takewhile


class HostTier:
    """A second KV tier in host memory (Mooncake's DRAM pool): every prefix block a replica computes is written
    through to it when its prefill ends (LRU, capacity in blocks), so a later request whose prefix continues past
    what its replica's HBM still caches loads those blocks instead of recomputing them.

    ``local``: one tier per replica, loaded over that node's PCIe; ``global``: one tier shared by the fleet (every
    node's DRAM pooled, Mooncake Store), loaded over RDMA. ``load_s(n)`` = latency + n blocks x bytes per block /
    (tp x per-GPU link GB/s): each of the replica's tp GPUs loads its own KV shard over its own link.
    """

    __slots__ = ("capacity", "blocks", "block_s", "latency_s", "hits", "loads")

    def __init__(self, capacity: int, block_bytes: float, link_gbps: float, tp: int, latency_s: float) -> None:
        assert capacity >= 1 and link_gbps > 0
        self.capacity = capacity
        self.blocks: dict[int, None] = {}
        self.block_s = block_bytes / (tp * link_gbps * 1e9)
        self.latency_s = latency_s
        self.hits = 0
        self.loads = 0

    def put(self, b: int) -> None:
        blocks = self.blocks
        if b in blocks:
            del blocks[b]
        elif len(blocks) >= self.capacity:
            del blocks[next(iter(blocks))]
        blocks[b] = None

    def match(self, hash_ids: tuple[int, ...], start: int) -> int:
        """Leading blocks of ``hash_ids[start:]`` held here (touched as most recently used)."""
        blocks = self.blocks
        n = 0
        for b in hash_ids[start:]:
            if b not in blocks:
                break
            del blocks[b]
            blocks[b] = None
            n += 1
        return n

    def load_s(self, n: int) -> float:
        self.hits += n
        self.loads += 1
        return self.latency_s + n * self.block_s


class PrefixCache:
    """Block accounting of one replica; every count is in blocks."""

    __slots__ = ("capacity", "free", "ref", "lru", "evictions", "host")

    def __init__(self, capacity: int, host: HostTier | None = None) -> None:
        assert capacity >= 1
        self.capacity = capacity
        self.host = host
        """Second tier that evicted prefix blocks move to (None: evicted blocks are gone)."""
        self.free = capacity
        """Blocks holding nothing."""
        self.ref: dict[int, int] = {}
        """Cached block id -> number of running requests using it (0 = evictable, then also in lru)."""
        self.lru: dict[int, None] = {}
        """Evictable cached blocks, least recently released first."""
        self.evictions = 0

    def match(self, hash_ids: tuple[int, ...]) -> int:
        """Number of leading blocks of ``hash_ids`` that are cached."""
        return len(list(takewhile(self.ref.__contains__, hash_ids)))

    def host_match(self, hash_ids: tuple[int, ...], start: int) -> int:
        """Blocks after the first ``start`` (cached in HBM) that the host tier holds, contiguous."""
        return self.host.match(hash_ids, start) if self.host is not None else 0

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
            c = ref[b]
            if c == 0:
                del lru[b]
            ref[b] = c + 1
        n = private - self.free
        if n > 0:
            for b in list(islice(lru, n)):
                del lru[b]
                del ref[b]
            self.free += n
            self.evictions += n
        self.free -= private
        return True

    def commit(self, hash_ids: tuple[int, ...], hit: int) -> None:
        """Prefill done: the request's private prompt blocks ``hash_ids[hit:]`` become cached (pinned) blocks.

        If another request cached the same id meanwhile, that copy is shared and ours is freed.
        """
        ref = self.ref
        get = ref.get
        if self.host is not None:
            for b in hash_ids[hit:]:
                self.host.put(b)
        for b in hash_ids[hit:]:
            c = get(b)
            if c is None:
                ref[b] = 1
            else:
                if c == 0:
                    del self.lru[b]
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
