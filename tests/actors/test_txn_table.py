"""The transaction coordinator's pure state machine (actors/group/transactions.py): every
transition, persist-before-answer, fencing by epoch, timeouts, expiry and the id limit, and the
records' byte layout (actors/group/log_records.py) round trip."""

from __future__ import annotations

from typing import Any

import pytest

from actors.group.log_records import (
    TransactionKey,
    decode_key,
    decode_transaction_value,
    encode_transaction_key,
    encode_transaction_value,
)
from actors.group.transactions import (
    EPOCH_MAX,
    NeedProducerId,
    Persist,
    Reply,
    TransactionTable,
    TxnMetadata,
    TxnState,
    WriteMarkers,
)
from wire.errors import DecodeError
from wire.errors import ErrorCode as E

pytestmark = pytest.mark.timeout(30)

MAX_TIMEOUT_MS = 60_000
EXPIRATION_MS = 1_000_000
TP0 = ("t", 0)
TP1 = ("t", 1)


class Answers:
    """A reply callback that keeps what it was called with."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def __call__(self, *args: Any) -> None:
        self.calls.append(args)

    @property
    def last(self) -> tuple[Any, ...]:
        return self.calls[-1]


def run(table: TransactionTable, effects: list[Any], now: int = 0,
        fail: E | None = None) -> list[Any]:
    """Carry the effects out as the coordinator would (appends succeed unless `fail`, markers
    are written at once); return every effect seen, in order."""
    seen: list[Any] = []
    queue = list(effects)
    while queue:
        effect = queue.pop(0)
        seen.append(effect)
        if isinstance(effect, Reply):
            effect.to(*effect.args)
        elif isinstance(effect, Persist):
            queue += table.persisted(effect.transactional_id, fail or E.NONE, now)
        elif isinstance(effect, WriteMarkers):
            queue += table.markers_written(effect.transactional_id, now)
    return seen


def init(table: TransactionTable, tid: str = "x", timeout: int = 10_000, now: int = 0,
         expected: tuple[int, int] = (-1, -1), fresh: int = 7) -> tuple[Any, ...]:
    answers = Answers()
    effects = table.init_producer_id(tid, timeout, *expected, now, answers)
    if effects and isinstance(effects[0], NeedProducerId):
        effects = table.init_producer_id(tid, timeout, *expected, now, answers, fresh)
    run(table, effects, now)
    return answers.last


def add(table: TransactionTable, pid: int, epoch: int, tid: str = "x", now: int = 0,
        partitions: tuple[tuple[str, int], ...] = (TP0,)) -> E:
    answers = Answers()
    run(table, table.add_partitions(tid, pid, epoch, partitions, now, answers), now)
    return E(answers.last[0])


def end(table: TransactionTable, pid: int, epoch: int, commit: bool, tid: str = "x",
        now: int = 0) -> E:
    answers = Answers()
    run(table, table.end_txn(tid, pid, epoch, commit, now, answers), now)
    return E(answers.last[0])


def new_table(ids_max: int = 100) -> TransactionTable:
    return TransactionTable(MAX_TIMEOUT_MS, EXPIRATION_MS, ids_max)


def test_new_id_gets_a_fresh_producer_id_then_epochs_bump() -> None:
    table = new_table()
    assert init(table) == (E.NONE, 7, 0)
    assert table.entries["x"].state == TxnState.EMPTY
    assert init(table) == (E.NONE, 7, 1)
    assert init(table) == (E.NONE, 7, 2)


def test_timeout_over_the_max_is_refused() -> None:
    table = new_table()
    assert init(table, timeout=MAX_TIMEOUT_MS + 1) == (E.INVALID_TRANSACTION_TIMEOUT, -1, -1)
    assert init(table, timeout=0) == (E.INVALID_TRANSACTION_TIMEOUT, -1, -1)
    assert "x" not in table.entries


def test_commit_persists_prepare_then_markers_then_complete() -> None:
    table = new_table()
    init(table)
    assert add(table, 7, 0, now=5, partitions=(TP0, TP1)) == E.NONE
    meta = table.entries["x"]
    assert (meta.state, meta.partitions, meta.start_ms) == (TxnState.ONGOING, {TP0, TP1}, 5)
    answers = Answers()
    effects = table.end_txn("x", 7, 0, True, 9, answers)
    assert effects == [Persist("x", table._pending["x"].target)]
    assert answers.calls == []  # not before PrepareCommit is persisted
    prepared = table.persisted("x", E.NONE, 9)
    assert table.entries["x"].state == TxnState.PREPARE_COMMIT
    assert isinstance(prepared[0], Reply) and prepared[0].args == (E.NONE,)
    assert prepared[1] == WriteMarkers("x", 7, 0, True, frozenset({TP0, TP1}))
    prepared[0].to(*prepared[0].args)
    assert answers.calls == [(E.NONE,)]
    # While the markers are out, the producer's next requests wait.
    assert add(table, 7, 0) == E.CONCURRENT_TRANSACTIONS
    assert end(table, 7, 0, True) == E.CONCURRENT_TRANSACTIONS
    assert end(table, 7, 0, False) == E.INVALID_TXN_STATE
    run(table, table.markers_written("x", 10), 10)
    meta = table.entries["x"]
    assert (meta.state, meta.partitions, meta.start_ms) == (TxnState.COMPLETE_COMMIT,
                                                           frozenset(), -1)
    # A retried EndTxn of the same outcome is NONE; the other outcome is refused.
    assert end(table, 7, 0, True) == E.NONE
    assert end(table, 7, 0, False) == E.INVALID_TXN_STATE
    # The next transaction starts from CompleteCommit.
    assert add(table, 7, 0, now=20) == E.NONE
    assert table.entries["x"].start_ms == 20


def test_abort_and_wrong_states() -> None:
    table = new_table()
    init(table)
    assert end(table, 7, 0, True) == E.INVALID_TXN_STATE  # Empty
    add(table, 7, 0)
    seen = run(table, table.end_txn("x", 7, 0, False, 3, Answers()), 3)
    assert WriteMarkers("x", 7, 0, False, frozenset({TP0})) in seen
    assert table.entries["x"].state == TxnState.COMPLETE_ABORT
    assert end(table, 7, 0, False) == E.NONE
    assert end(table, 7, 0, True) == E.INVALID_TXN_STATE


def test_producer_checks() -> None:
    table = new_table()
    assert add(table, 7, 0) == E.INVALID_PRODUCER_ID_MAPPING  # unknown id
    init(table)
    init(table)  # epoch 1
    assert add(table, 8, 1) == E.INVALID_PRODUCER_ID_MAPPING
    assert add(table, 7, 0) == E.PRODUCER_FENCED
    assert end(table, 7, 0, True) == E.PRODUCER_FENCED
    assert add(table, 7, 1) == E.NONE
    assert add(table, 7, 1) == E.NONE  # already in: no record
    assert add(table, 7, 1, partitions=(TP1,)) == E.NONE
    assert table.entries["x"].partitions == {TP0, TP1}


def test_init_of_an_ongoing_transaction_aborts_it_with_the_epoch_bumped() -> None:
    """A second producer with the same id: the first's transaction is aborted at a bumped
    epoch (fencing it at the partitions); the second retries until that is done."""
    table = new_table()
    init(table)
    add(table, 7, 0)
    answers = Answers()
    effects = table.init_producer_id("x", 10_000, -1, -1, 50, answers)
    assert answers.calls == [] and len(effects) == 2
    assert effects[1].args == (E.CONCURRENT_TRANSACTIONS, -1, -1)
    prepared = table.persisted("x", E.NONE, 50)
    assert prepared == [WriteMarkers("x", 7, 1, False, frozenset({TP0}))]
    assert table.entries["x"].state == TxnState.PREPARE_ABORT
    assert init(table, now=51) == (E.CONCURRENT_TRANSACTIONS, -1, -1)  # markers out
    run(table, table.markers_written("x", 52), 52)
    assert table.entries["x"].state == TxnState.COMPLETE_ABORT
    assert init(table, now=53) == (E.NONE, 7, 2)
    # The zombie, at epoch 0, is fenced.
    assert end(table, 7, 0, True) == E.PRODUCER_FENCED
    assert add(table, 7, 0) == E.PRODUCER_FENCED


def test_kip_360_expected_producer() -> None:
    table = new_table()
    init(table)
    assert init(table, expected=(7, 0)) == (E.NONE, 7, 1)
    assert init(table, expected=(7, 0)) == (E.NONE, 7, 1)  # a retry: the same answer
    assert init(table, expected=(7, 5)) == (E.PRODUCER_FENCED, -1, -1)
    assert init(table, expected=(9, 1)) == (E.PRODUCER_FENCED, -1, -1)
    assert init(table, expected=(7, 1)) == (E.NONE, 7, 2)
    # A new producer of the id (no expected epoch) fences the old one: its bump from its
    # epoch is no retry any more.
    assert init(table) == (E.NONE, 7, 3)
    assert init(table, expected=(7, 2)) == (E.PRODUCER_FENCED, -1, -1)


def test_exhausted_epoch_takes_a_new_producer_id() -> None:
    table = new_table()
    init(table)
    table.entries["x"] = _with(table.entries["x"], producer_epoch=EPOCH_MAX - 1)
    assert init(table, fresh=99) == (E.NONE, 99, 0)


def test_failed_append_answers_the_error_and_changes_nothing() -> None:
    table = new_table()
    init(table)
    add(table, 7, 0)
    answers = Answers()
    run(table, table.end_txn("x", 7, 0, True, 1, answers), 1, fail=E.NOT_COORDINATOR)
    assert answers.calls == [(E.NOT_COORDINATOR,)]
    assert table.entries["x"].state == TxnState.ONGOING
    answers = Answers()
    run(table, table.init_producer_id("y", 100, -1, -1, 0, answers, 8), 0,
        fail=E.COORDINATOR_NOT_AVAILABLE)
    assert answers.calls == [(E.COORDINATOR_NOT_AVAILABLE, -1, -1)]
    assert "y" not in table.entries


def test_timeout_aborts_with_an_epoch_bump() -> None:
    table = new_table()
    init(table, timeout=1_000)
    add(table, 7, 0, now=100)
    assert table.next_deadline_ms() == 1_100
    assert table.tick(1_099) == []
    seen = run(table, table.tick(1_100), 1_100)
    assert WriteMarkers("x", 7, 1, False, frozenset({TP0})) in seen
    assert table.entries["x"].state == TxnState.COMPLETE_ABORT
    assert table.entries["x"].producer_epoch == 1
    assert end(table, 7, 0, True) == E.PRODUCER_FENCED  # the late producer
    assert table.next_deadline_ms() == 1_100 + EXPIRATION_MS


def test_idle_ids_expire() -> None:
    table = new_table()
    init(table, now=0)
    init(table, "y", now=500)
    seen = run(table, table.tick(EXPIRATION_MS), EXPIRATION_MS)
    assert seen == [Persist("x", None)]
    assert set(table.entries) == {"y"}
    run(table, table.tick(EXPIRATION_MS + 500), EXPIRATION_MS + 500)
    assert table.entries == {}
    assert table.next_deadline_ms() is None


def test_ongoing_is_not_expired() -> None:
    table = TransactionTable(MAX_TIMEOUT_MS, 10, 100)
    init(table, timeout=50_000)
    add(table, 7, 0, now=1)
    assert run(table, table.tick(20), 20) == []


def test_limit_forgets_the_oldest_completed() -> None:
    table = new_table(ids_max=2)
    init(table, "a", now=1, fresh=1)
    init(table, "b", now=2, fresh=2)
    answers = Answers()
    effects = table.init_producer_id("c", 100, -1, -1, 3, answers, 3)
    assert effects[0] == Persist("a", None)
    run(table, effects, 3)
    assert set(table.entries) == {"b", "c"}
    # Full of open transactions: a new id waits (retriable).
    add(table, 2, 0, "b")
    add(table, 3, 0, "c")
    assert init(table, "d", fresh=4) == (E.COORDINATOR_NOT_AVAILABLE, -1, -1)
    assert len(table) == 2


def test_resume_completes_prepared_and_keeps_ongoing() -> None:
    table = new_table()
    prepared = TxnMetadata(7, 3, 2, 1_000, TxnState.PREPARE_COMMIT, frozenset({TP0}), 5, 6)
    ongoing = TxnMetadata(8, 0, -1, 1_000, TxnState.ONGOING, frozenset({TP1}), 10, 10)
    effects = table.resume({"p": prepared, "o": ongoing})
    assert effects == [WriteMarkers("p", 7, 3, True, frozenset({TP0}))]
    assert add(table, 7, 3, "p") == E.CONCURRENT_TRANSACTIONS
    run(table, table.markers_written("p", 20), 20)
    assert table.entries["p"].state == TxnState.COMPLETE_COMMIT
    assert table.next_deadline_ms() == 1_010  # the Ongoing one's timeout, from its start


def test_forget_answers_waiting_clients() -> None:
    table = new_table()
    init(table)
    add(table, 7, 0)
    answers = Answers()
    table.end_txn("x", 7, 0, True, 1, answers)
    effects = table.forget(["x"])
    run(table, effects)
    assert answers.calls == [(E.NOT_COORDINATOR,)]
    assert table.entries == {} and not table.busy("x")
    assert table.persisted("x", E.NONE, 2) == []  # the late append answer


def test_record_round_trip() -> None:
    meta = TxnMetadata(123456789012, 5, 4, 60_000, TxnState.PREPARE_ABORT,
                       frozenset({("a", 0), ("a", 3), ("bé", 1)}), 1_700_000_000_000,
                       1_700_000_000_500)
    assert decode_transaction_value(encode_transaction_value(meta)) == meta
    assert decode_key(encode_transaction_key("tx-1")) == TransactionKey("tx-1")
    for state in TxnState:
        m = _with(meta, state=state)
        assert decode_transaction_value(encode_transaction_value(m)) == m
    data = encode_transaction_value(meta)
    for cut in range(len(data)):
        with pytest.raises(DecodeError):
            decode_transaction_value(data[:cut])


def _with(meta: TxnMetadata, **changes: Any) -> TxnMetadata:
    from dataclasses import replace
    return replace(meta, **changes)


def test_next_deadline_is_kept_without_scans_and_never_late() -> None:
    table = new_table()
    init(table, "a", timeout=5_000, now=0, fresh=1)
    assert table.next_deadline_ms() == EXPIRATION_MS  # a's expiry
    add(table, 1, 0, "a", now=100)
    assert table.next_deadline_ms() == 5_100  # its timeout, noted as it went Ongoing
    end(table, 1, 0, True, "a", now=200)
    assert table.next_deadline_ms() == 5_100  # stale (earlier than the truth), not late
    assert table.tick(5_100) == []  # nothing to do: the scan notes the true deadline
    assert table.next_deadline_ms() == 200 + EXPIRATION_MS
