"""Session keys for session-affinity routing, and the check that a router does not pile load on one replica.

A Mooncake trace has no session column: a request continues a conversation when its leading ``hash_ids`` (chained
512-token prefix-block ids) equal an earlier request's. Keying sessions on the *first* block fails on real traffic:
every request of a service starts with the same system-prompt block(s), so one key (one replica) gets the whole
trace. The key here is the first block *after the shared prefix*:

- a block is a *branch point* when it has >= ``SHARED_CHILDREN`` distinct next blocks in the trace. Within one
  conversation a block gets a second next block only when a turn ends inside the following block (its partial last
  block differs from the next turn's full one), so a conversation branches at most a few ways at any block; a system
  prompt continues into every conversation that uses it;
- a block is *shared* when it is a branch point or comes before one in some request (ids are chained, so those
  are its ancestors: the system prompt's earlier blocks); a request's session key is its first block that is not
  shared; a request that has none (it ends inside a shared prefix) is its own session.

Limits, measured on the seeded synthetic chats (phase6.fleet.workload.synthetic, whose sessions are known): a
conversation whose first turn ends inside its first private block gets a second key from turn 2 on (that block was
partial and its id changes once the conversation grows past it; 22 % of 1,334 three-turn sessions), which costs no
cache (a partial block is never reused); and sessions under a system prompt used by fewer than ``SHARED_CHILDREN``
conversations share that prompt's key (0-5 % of keys), which keeps them on the replica that caches it.

When the trace names its sessions (a ``session_id`` field in a Mooncake row, the synthetic generator's sessions), that
key is used instead. The rule is a property of the trace, computed once at load time in O(total blocks).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

SHARED_CHILDREN = 8
"""Distinct next blocks that make a block a branch point of shared content (a system prompt or template)."""

CONCENTRATION_WARN = 2.0
"""A router that sends more than this many times a fair share (1 / replicas) of the requests to one replica is
named in a warning (a session key or a prefix that carries a large share of the traffic cannot be balanced)."""


def session_keys(hash_ids: Sequence[tuple[int, ...]], shared_children: int = SHARED_CHILDREN) -> np.ndarray:
    """Per request, the id of its first block after the shared prefix (see the module docstring); a request with no
    such block gets its own key ``-1 - index`` (block ids are >= 0 in the published traces)."""
    children: dict[int, set[int] | int] = {}
    for h in hash_ids:
        for a, b in zip(h, h[1:], strict=False):
            c = children.get(a)
            if c is None:
                children[a] = b  # one child stored bare: most blocks never branch
            elif isinstance(c, int):
                if c != b:
                    children[a] = {c, b}
            else:
                c.add(b)
    branch = {a for a, c in children.items() if not isinstance(c, int) and len(c) >= shared_children}
    shared: set[int] = set()  # branch points and every block before one (ids are chained: ancestors)
    for h in hash_ids:
        last = max((j for j, b in enumerate(h) if b in branch), default=-1)
        shared.update(h[: last + 1])
    keys = np.empty(len(hash_ids), dtype=np.int64)
    for i, h in enumerate(hash_ids):
        keys[i] = next((b for b in h if b not in shared), -1 - i)
    return keys


def replica_share(replica: np.ndarray) -> tuple[int, float]:
    """(replica id, share of requests) of the replica that the router sent the most requests to."""
    if len(replica) == 0:
        return -1, 0.0
    counts = np.bincount(replica[replica >= 0])
    top = int(counts.argmax())
    return top, float(counts[top] / len(replica))


def concentration_warning(router: str, policy: str, replica: np.ndarray, replicas: int) -> str | None:
    """A one-line warning when one replica got more than ``CONCENTRATION_WARN`` / replicas of the requests."""
    if replicas < 2:
        return None
    top, share = replica_share(replica)
    fair = 1.0 / replicas
    if share <= CONCENTRATION_WARN * fair:
        return None
    hint = (
        " (session keys carry too much traffic: a trace whose requests share their first blocks needs keys after the "
        "shared prefix, phase6.fleet.sessions)"
        if router == "session_affinity"
        else ""
    )
    return (
        f"warning: {policy} / {router} sent {share:.0%} of the requests to replica {top}, more than "
        f"{CONCENTRATION_WARN:g} x the fair share 1/{replicas} = {fair:.1%}{hint}"
    )
