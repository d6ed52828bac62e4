"""Which rank hashes what: one exchange, agreement, assignment and same-file rule for every multi-rank user.

Distributed publish and verify (``distributed``: torch ranks over shared storage) and
engines whose ranks load one model (the vLLM plugin's ``node_share``) both split
hashing between ranks, so both need the same four things, and two copies of them had
already drifted apart:

- an **exchange** of fixed-size byte rows over a caller-supplied
  ``all_gather(row) -> rows`` (torch's gloo ``all_gather``, vLLM's ``cpu_group``, a
  test's threads: this module imports neither torch nor any engine), each row framed
  with a status byte and room for a message, so that
- the **agreement** holds: a rank with a problem sends it in its row, and every rank
  refuses when any does, naming the lowest such rank and its problem
  (``RankRefusedError``); no pickle, nothing but bytes of one agreed length;
- the **assignment**: each item, largest first, to the least-loaded rank that can take
  it (the lowest on ties), computed from data every rank holds, so every rank computes
  the same owners without another exchange;
- the **same-file rule** (``storage_fingerprint``): when a rank may rely on another
  rank's digest of bytes it did not hash itself. Publish and verify ask "do these
  ranks read the same file on storage", wherever each runs; an engine asks "do these
  ranks read the very same bytes through one kernel's page cache", because what each
  rank loads must be what was hashed. One rule, with the question as its
  ``one_page_cache`` argument.

``split_hashing`` combines them into the plan an engine's ranks make before they
stream a model. The public face is ``ckptpub.distributed``.
"""

from __future__ import annotations

import heapq
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import blake3

from .._filesystem.objects import is_object_url
from ..errors import CkptpubError

#: A collective every rank calls with a row of one agreed length; it returns every rank's row in rank order.
AllGather = Callable[[bytes], Sequence[bytes]]

#: Room for a rank's problem in each row (a longer message is cut at a character boundary).
MESSAGE_BYTES = 1024
_OK, _FAILED = 0, 1
_PAYLOAD_AT = 1 + MESSAGE_BYTES

#: What a rank will see of the items ``split_hashing`` plans: every one, those its ``sees`` lists, or
#: not known (it then hashes all it sees itself and takes no share of the others' work).
READS_ALL, READS_LISTED, READS_UNKNOWN = 0, 1, 2
FINGERPRINT_BYTES = 32
BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"


class ExchangeError(CkptpubError):
    """The exchange itself failed (a rank died or timed out, a row came back of another length):
    nothing can be agreed over it any more."""


class RankRefusedError(CkptpubError):
    """A rank sent a problem: every rank raises this, naming the lowest rank that sent one."""

    def __init__(self, rank: int, problem: str) -> None:
        super().__init__(f"rank {rank}: {problem}")
        self.rank = rank
        self.problem = problem


@dataclass(frozen=True)
class Exchange:
    """The ranks that exchange rows: ``all_gather`` over ``size`` ranks, this one at ``rank``.

    Every rank must call each method at the same point with payloads of one length.
    """

    all_gather: AllGather
    rank: int
    size: int

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.size:
            raise CkptpubError(f"rank {self.rank} is not one of {self.size} ranks")

    def rows(self, payload: bytes, problem: str | None = None) -> list[bytes]:
        """Every rank's ``payload``, in rank order; ``RankRefusedError`` on every rank if any has a problem.

        A rank with a problem still sends a payload of the agreed length (zeros will do).
        """
        row = bytearray(_PAYLOAD_AT)
        if problem is not None:
            row[0] = _FAILED
            cut = problem.encode("utf-8", "replace")[:MESSAGE_BYTES].decode("utf-8", "ignore").encode()
            row[1 : 1 + len(cut)] = cut
        mine = bytes(row) + payload
        rows = [bytes(other) for other in self.all_gather(mine)]
        if len(rows) != self.size:
            raise ExchangeError(f"the exchange returned {len(rows)} rows for {self.size} ranks")
        for rank, other in enumerate(rows):
            if len(other) != len(mine):
                raise ExchangeError(f"rank {rank} sent a row of {len(other)} bytes, not {len(mine)}")
            if other[0] not in (_OK, _FAILED):
                raise ExchangeError(f"rank {rank} sent a row with an unknown status {other[0]}")
        if rows[self.rank] != mine:
            raise ExchangeError(f"the exchange returned another row than this rank's at rank {self.rank}")
        for rank, other in enumerate(rows):
            if other[0] == _FAILED:
                text = other[1:_PAYLOAD_AT].rstrip(b"\0").decode("utf-8", "replace")
                raise RankRefusedError(rank, text)
        return [other[_PAYLOAD_AT:] for other in rows]

    def agree(self, problem: str | None) -> None:
        """Agree on an outcome: returns on every rank when no rank has a problem, else raises
        ``RankRefusedError`` on every rank (this rank's own problem included)."""
        self.rows(b"", problem)


def assign(
    sizes: Sequence[int], ranks: Sequence[int], eligible: Callable[[int, int], bool] | None = None
) -> list[int | None]:
    """The rank of ``ranks`` that hashes each item: largest first (the first on ties) to the least-loaded
    rank for which ``eligible(rank, item)`` holds (any rank when None; the lowest on ties), None when no
    rank may take it. Depends on its arguments only, so every rank computes the same owners."""
    owners: list[int | None] = [None] * len(sizes)
    loads = [(0, rank) for rank in sorted(ranks)]
    for item in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        passed = []  # least-loaded first, until one may take the item; put back afterwards
        while loads and eligible is not None and not eligible(loads[0][1], item):
            passed.append(heapq.heappop(loads))
        if loads:
            load, rank = heapq.heappop(loads)
            owners[item] = rank
            heapq.heappush(loads, (load + sizes[item], rank))
        for entry in passed:
            heapq.heappush(loads, entry)
    return owners


def storage_fingerprint(paths: Iterable[str], *, one_page_cache: bool) -> bytes:
    """BLAKE3 of each file's identity on storage (inode, size, modification and change times), in order.

    Equal on two ranks that list their files in one order when they read the same files,
    unchanged: a copy is another inode, or was written at another time (a file's owner
    can set its modification time back but not its change time). A file that cannot be
    stat-ed makes the fingerprint this rank's alone.

    ``one_page_cache=False`` asks "the same files on storage, wherever each rank runs"
    (publish, verify: ranks on several nodes of one shared file system). The device
    number is left out on purpose: each NFS client numbers its mount of an export its
    own way (as two mounts of one file system may), while the inode number is the
    server's and stable; the times and size are what tell a copy from the file.

    ``one_page_cache=True`` asks "the very same bytes through one kernel's page cache"
    (an engine's ranks, which trust another rank's digest of the bytes they load
    themselves): it adds this kernel's boot id and each file's device number. Ranks on
    another node (another boot id: another page cache, another NFS client cache) do
    not match; on one kernel the device number names the superblock, and so the page
    cache: a bind mount into a container keeps it, a second NFS mount of the export
    with its own cache (``nosharecache``, other options) does not. A kernel without a
    boot id (not Linux) matches no other rank.
    """
    hasher = blake3.blake3()
    if one_page_cache:
        try:
            with open(BOOT_ID_PATH, "rb") as boot:
                hasher.update(boot.read(64))
        except OSError:  # no proof that two ranks share a page cache, so none shares work
            hasher.update(os.urandom(FINGERPRINT_BYTES))
    for path in paths:
        if is_object_url(path):  # one store's object (which version: ``plan_fingerprint``)
            hasher.update(f"object {path}\n".encode("utf-8", "surrogateescape"))
            continue
        try:
            info = os.stat(path)
        except OSError:
            identity = f"unreadable {os.urandom(8).hex()}"
        else:
            identity = f"{info.st_ino} {info.st_size} {info.st_mtime_ns} {info.st_ctime_ns}"
            if one_page_cache:
                identity = f"{info.st_dev} {identity}"
        hasher.update(f"{identity}\n".encode())
    return hasher.digest()


@dataclass(frozen=True)
class Share:
    """What ``split_hashing`` leaves to this rank."""

    mine: frozenset[str] | None  # the items this rank hashes; None: every item it sees
    total: int  # the items planned
    helpers: int  # ranks of this rank's reading group, itself included (1: it hashes alone)


def split_hashing(
    exchange: Exchange,
    identity: str,
    sizes: Mapping[str, int],
    fingerprint: bytes,
    reads: int,
    sees: Callable[[str], bool] | None = None,
) -> Share:
    """Plan which of the items (``sizes``: bytes by name) this rank hashes, with the ranks of ``exchange``.

    Collective. Each rank sends the manifest ``identity`` it read, its
    ``storage_fingerprint`` and what it ``reads`` (``READS_*``; for ``READS_LISTED``,
    ``sees`` says which items, and a bitmap of them follows). Ranks with equal
    fingerprints that know what they will see form a reading group; every item goes
    (``assign``) to a rank of this rank's group that sees it. Raises ``CkptpubError`` on
    every rank alike when the ranks read different manifests.
    """
    read = blake3.blake3(identity.encode("utf-8", "surrogateescape")).digest()
    rows = exchange.rows(read + fingerprint + bytes([reads]))
    if len({other[:FINGERPRINT_BYTES] for other in rows}) > 1:
        raise CkptpubError("the ranks read different manifests (the checkpoint changed between their reads?)")
    names = sorted(sizes)
    listed = None
    if any(other[-1] == READS_LISTED for other in rows):
        bitmap = bytearray((len(names) + 7) // 8)
        if reads == READS_LISTED and sees is not None:
            for position, name in enumerate(names):
                if sees(name):
                    bitmap[position // 8] |= 1 << (position % 8)
        listed = exchange.rows(bytes(bitmap))
    group = [
        rank
        for rank, other in enumerate(rows)
        if other[FINGERPRINT_BYTES:-1] == fingerprint and other[-1] != READS_UNKNOWN
    ]
    if reads == READS_UNKNOWN or len(group) < 2:
        return Share(None, len(names), 1)

    def seen_by(rank: int, position: int) -> bool:
        if listed is None or rows[rank][-1] == READS_ALL:
            return True
        return bool(listed[rank][position // 8] >> (position % 8) & 1)

    owners = assign([sizes[name] for name in names], group, seen_by)
    mine = frozenset(name for name, owner in zip(names, owners, strict=True) if owner == exchange.rank)
    return Share(mine, len(names), len(group))
