"""Which rank hashes what (``ckptpub.distributed``'s engine-neutral rules, ``_hashing/ranks``).

The exchange runs over a real collective: threads, one per rank, meeting at a barrier
(what torch's gloo ``all_gather`` or vLLM's ``cpu_group`` does between processes). The
same-file rule runs on real files. The torch users are tested with real ranks in
``tests/callback/test_distributed_publish.py`` and ``tests/vllm/test_node_share.py``.
"""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from ckptpub import distributed as ranks
from ckptpub.errors import CkptpubError

IDENTITY = "blake3:" + "ab" * 32


def on_ranks(size: int, work: Callable[[ranks.Exchange], object]) -> list[object]:
    """``work`` on ``size`` threads, each with an exchange over a barrier; each rank's result or error."""
    slots: list[bytes] = [b""] * size
    barrier = threading.Barrier(size, timeout=30)

    def gather_for(rank: int) -> Callable[[bytes], list[bytes]]:
        def all_gather(row: bytes) -> list[bytes]:
            slots[rank] = row
            barrier.wait()
            rows = list(slots)
            barrier.wait()  # nobody writes the next row before every rank has read this one
            return rows

        return all_gather

    def run(rank: int) -> object:
        try:
            return work(ranks.Exchange(gather_for(rank), rank, size))
        except CkptpubError as error:
            return error

    with ThreadPoolExecutor(size) as pool:
        return list(pool.map(run, range(size)))


def test_every_rank_gets_every_payload_in_rank_order() -> None:
    results = on_ranks(3, lambda exchange: exchange.rows(bytes([exchange.rank]) * 5))
    assert results == [[bytes([r]) * 5 for r in range(3)]] * 3


def test_every_rank_refuses_when_any_does_naming_the_lowest_rank_and_its_problem() -> None:
    problems = {1: "tensor 'a' differs", 2: "shard b is gone"}
    results = on_ranks(3, lambda exchange: exchange.agree(problems.get(exchange.rank)))
    assert all(isinstance(result, ranks.RankRefusedError) for result in results), results
    assert {(r.rank, r.problem) for r in results if isinstance(r, ranks.RankRefusedError)} == {
        (1, "tensor 'a' differs")
    }
    assert str(results[0]) == "rank 1: tensor 'a' differs"
    assert on_ranks(2, lambda exchange: exchange.agree(None)) == [None, None]


def test_a_problem_longer_than_the_row_is_cut_at_a_character_boundary() -> None:
    kept = "x" * (ranks.MESSAGE_BYTES - 1)
    problem = kept + "é" + "never sent"  # é is 2 bytes: it would straddle the cut
    results = on_ranks(2, lambda exchange: exchange.agree(problem if exchange.rank else None))
    assert [r.problem for r in results if isinstance(r, ranks.RankRefusedError)] == [kept, kept]
    newline = on_ranks(2, lambda exchange: exchange.agree("two\nlines" if exchange.rank else None))
    assert str(newline[0]) == "rank 1: two\\nlines"  # one line, as every CkptpubError


def answering(rows: Sequence[bytes]) -> Callable[[bytes], Sequence[bytes]]:
    """An ``all_gather`` that answers ``rows`` whatever it was sent, this rank's row first."""
    return lambda row: [row, *rows]


def test_a_row_of_another_size_or_a_wrong_answer_is_refused() -> None:
    sent = bytes(1 + ranks.MESSAGE_BYTES) + b"ab"
    assert ranks.Exchange(answering([sent]), 0, 2).rows(b"ab") == [b"ab", b"ab"]
    with pytest.raises(ranks.ExchangeError, match="rank 1 sent a row of 1028 bytes, not 1027"):
        ranks.Exchange(answering([sent + b"c"]), 0, 2).rows(b"ab")
    with pytest.raises(ranks.ExchangeError, match="rank 1 sent a row of 1026 bytes"):
        ranks.Exchange(answering([sent[:-1]]), 0, 2).rows(b"ab")
    with pytest.raises(ranks.ExchangeError, match="returned 3 rows for 2 ranks"):
        ranks.Exchange(answering([sent, sent]), 0, 2).rows(b"ab")
    with pytest.raises(ranks.ExchangeError, match="unknown status 7"):
        ranks.Exchange(answering([b"\x07" + sent[1:]]), 0, 2).rows(b"ab")
    with pytest.raises(ranks.ExchangeError, match="another row than this rank's"):
        ranks.Exchange(lambda row: [row[:-1] + b"z", row], 0, 2).rows(b"ab")
    with pytest.raises(CkptpubError, match="rank 2 is not one of 2 ranks"):
        ranks.Exchange(answering([]), 2, 2)


def test_assignment_is_largest_first_to_the_least_loaded_rank_and_deterministic() -> None:
    sizes = [50, 30, 40, 30, 10, 10]
    owners = ranks.assign(sizes, [0, 1])
    loads = [sum(s for s, o in zip(sizes, owners, strict=True) if o == rank) for rank in (0, 1)]
    assert owners == [0, 1, 1, 0, 1, 0]  # 50->0, 40->1, 30 (first)->1, 30->0, 10->1, 10->0
    assert loads == [90, 80]
    assert ranks.assign(sizes, [1, 0]) == owners  # the order ranks are listed in does not matter
    assert ranks.assign(list(sizes), range(2)) == owners  # every rank computes the same owners
    assert ranks.assign([5, 5, 5], [0, 1, 2, 3, 4]) == [0, 1, 2]  # more ranks than items: the lowest
    assert ranks.assign([], [0]) == []


def test_assignment_balances_many_items() -> None:
    sizes = [(i * 7919) % 1000 + 1 for i in range(500)]
    owners = ranks.assign(sizes, range(8))
    loads = [sum(s for s, o in zip(sizes, owners, strict=True) if o == rank) for rank in range(8)]
    assert max(loads) - min(loads) <= max(sizes)  # greedy largest-first: within one item of even


def test_assignment_gives_each_item_only_to_a_rank_that_may_take_it() -> None:
    sizes = [10, 9, 8, 7]
    owners = ranks.assign(sizes, [3, 5], lambda rank, item: rank == 5 or item % 2 == 0)
    assert owners == [3, 5, 5, 5]  # 10->3; 9 only 5; 8: 5 (9) vs 3 (10) -> 5; 7 only 5
    assert ranks.assign(sizes, [0, 1], lambda rank, item: item != 2) == [0, 1, None, 1]


@pytest.fixture
def shard(tmp_path: Path) -> Path:
    path = tmp_path / "model.safetensors"
    path.write_bytes(b"\x01" * 4096)
    return path


@pytest.mark.parametrize("one_page_cache", [False, True])
def test_the_same_files_give_the_same_fingerprint_a_copy_or_a_change_another(
    shard: Path, tmp_path: Path, one_page_cache: bool
) -> None:
    def fingerprint(*paths: Path) -> bytes:
        return ranks.storage_fingerprint([str(p) for p in paths], one_page_cache=one_page_cache)

    other = tmp_path / "other.safetensors"
    other.write_bytes(b"\x02" * 10)
    (tmp_path / "view").mkdir()
    os.link(shard, tmp_path / "view" / shard.name)  # the very file under another path: the same inode
    before = fingerprint(shard, other)
    assert len(before) == 32
    assert fingerprint(shard, other) == before
    assert fingerprint(tmp_path / "view" / shard.name, other) == before
    assert fingerprint(other, shard) != before  # the files are compared in the order given
    copy = shutil.copy2(shard, tmp_path / "copy")  # same bytes, size and mtime; another inode
    assert fingerprint(Path(copy), other) != before

    info = shard.stat()
    os.utime(shard, ns=(info.st_atime_ns, info.st_mtime_ns + 1))
    assert fingerprint(shard, other) != before  # a changed modification time
    os.utime(shard, ns=(info.st_atime_ns, info.st_mtime_ns))
    changed = fingerprint(shard, other)  # the times set back: the change time still moved
    with open(shard, "r+b") as file:
        file.truncate(4000)
    os.utime(shard, ns=(info.st_atime_ns, info.st_mtime_ns))
    assert fingerprint(shard, other) != changed  # a changed size

    gone = tmp_path / "gone"
    assert fingerprint(gone) != fingerprint(gone)  # nothing proves an unreadable file is shared


def test_the_page_cache_question_is_a_stricter_one(shard: Path) -> None:
    paths = [str(shard)]
    engine = ranks.storage_fingerprint(paths, one_page_cache=True)
    assert ranks.storage_fingerprint(paths, one_page_cache=True) == engine
    assert ranks.storage_fingerprint(paths, one_page_cache=False) != engine


SIZES = {f"t{i}": size for i, size in enumerate([400, 300, 200, 100, 50])}


def plan_on_ranks(
    fingerprints: Sequence[bytes],
    reads: Sequence[int],
    sees: Callable[[int, str], bool] | None = None,
    identities: Sequence[str] = (IDENTITY,) * 3,
) -> list[object]:
    def work(exchange: ranks.Exchange) -> object:
        rank = exchange.rank
        see = None if sees is None else (lambda name: sees(rank, name))
        return ranks.split_hashing(exchange, identities[rank], SIZES, fingerprints[rank], reads[rank], see)

    return on_ranks(len(fingerprints), work)


def shares_of(results: list[object]) -> list[ranks.Share]:
    assert all(isinstance(result, ranks.Share) for result in results), results
    return [result for result in results if isinstance(result, ranks.Share)]


def split(share: ranks.Share) -> frozenset[str]:
    """The items a rank that took a share hashes."""
    assert share.mine is not None
    return share.mine


def test_ranks_reading_the_same_files_split_the_items_between_them() -> None:
    same, other = b"\x01" * 32, b"\x02" * 32
    shares = shares_of(plan_on_ranks([same, same, other], [ranks.READS_ALL] * 3))
    zero, one = split(shares[0]), split(shares[1])
    assert zero | one == set(SIZES)
    assert not zero & one
    assert shares[2].mine is None  # another reading: it hashes all it sees itself
    assert [share.helpers for share in shares] == [2, 2, 1]
    assert {share.total for share in shares} == {5}


def test_a_rank_that_does_not_know_what_it_reads_takes_no_share() -> None:
    same = b"\x01" * 32
    reads = [ranks.READS_ALL, ranks.READS_UNKNOWN, ranks.READS_ALL]
    shares = shares_of(plan_on_ranks([same, same, same], reads))
    assert shares[1].mine is None
    assert split(shares[0]) | split(shares[2]) == set(SIZES)


def test_an_item_only_one_rank_sees_is_that_ranks() -> None:
    same = b"\x01" * 32
    names = sorted(SIZES)
    results = plan_on_ranks(
        [same, same], [ranks.READS_LISTED, ranks.READS_ALL], lambda rank, name: names.index(name) % 2 == 0
    )
    zero, one = (split(share) for share in shares_of(results))
    assert zero <= set(names[::2])
    assert zero | one == set(names)


def test_ranks_that_read_different_manifests_all_refuse() -> None:
    other = "blake3:" + "cd" * 32
    results = plan_on_ranks([b"\x01" * 32] * 2, [ranks.READS_ALL] * 2, identities=(IDENTITY, other))
    assert all("the ranks read different manifests" in str(result) for result in results), results
