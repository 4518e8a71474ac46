"""Change tracking with two readers (the connector and the device block table), both
backends: each sees every change exactly once; a report never loses a change made while
it runs; a failed call gives its marks back; pickles carry the marks."""

import pickle
import sys
import threading
import time

import numpy as np
import pytest

from tokcy import RequestState, _pickle
from tokcy.connector import SchedulerOutputManager
from tokcy.demo.connector import OffloadStore
from tokcy.executor import InputPreparer

GENERATING = RequestState.GENERATION_IN_PROGRESS


def generating(module, request_id, num_tokens, num_blocks, slot=0):
    request = module.Request(request_id, np.arange(num_tokens, dtype=np.int32) % 1000)
    request.state = GENERATING
    request.block_tables[0].extend(range(num_blocks))
    request.seq_slot = slot
    return request


def report(manager, store, requests):
    store.apply(manager.build_scheduler_output([], requests))


def apply(mirror, output):
    """The block ids of group 0 after a report's cached delta."""
    for data in output.cached_requests:
        replaced = int(data.num_replaced_blocks_by_group[0])
        new = np.asarray(data.new_block_ids_by_group[0], dtype=np.int32)
        mirror = np.concatenate([mirror[: len(mirror) - replaced], new])
    return mirror


def test_a_change_made_while_a_report_runs_shows_in_the_next(backend):
    """Another thread rewrites block ids while large reports (copied without the GIL by
    the compiled core) run; the mirror built from all the reports, and a last quiet one,
    equals the table. (With the mark reset after the GIL-free copy, as before, a rewrite
    landing during the copy was lost and this failed.)"""
    manager = SchedulerOutputManager()
    request = generating(backend, 1, 16, 1 << 20)  # deltas of ~4 MiB: GIL-free copies that take a while
    table = request.block_tables[0]
    mirror = np.asarray(manager.build_scheduler_output([], [request]).new_requests[0].new_block_ids_by_group[0])
    started, stop = threading.Event(), threading.Event()
    writes = []

    def rewrite():
        # rising positions: a rewrite a report missed is never covered by a later delta
        for position in range(100_000):
            if stop.is_set():
                break
            table[position] = 7  # lowers the mark: the next delta starts at this position
            writes.append(position)
            started.set()

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    thread = threading.Thread(target=rewrite)
    try:
        thread.start()
        started.wait(10)
        for _ in range(20):
            seen = len(writes)
            while len(writes) == seen and thread.is_alive():
                time.sleep(0)  # let a rewrite land: the delta then runs to the end (large, so GIL-free)
            mirror = apply(mirror, manager.build_scheduler_output([], [request]))
    finally:
        stop.set()
        thread.join()
        sys.setswitchinterval(interval)
    mirror = apply(mirror, manager.build_scheduler_output([], [request]))
    assert len(writes) >= 20
    assert mirror.tolist() == table.tolist()


def test_a_failed_report_gives_the_marks_back(backend):
    manager, store = SchedulerOutputManager(), OffloadStore()
    good = generating(backend, 1, 8, 2)
    finished = generating(backend, 2, 8, 2)
    report(manager, store, [good])
    good.add_new_token(5)
    good.block_tables[0][1] = 9  # rewrites a reported block
    finished.state = RequestState.GENERATION_COMPLETE
    with pytest.raises(ValueError, match="finished"):
        manager.build_scheduler_output([], [good, finished])
    output = manager.build_scheduler_output([], [good])
    (data,) = output.cached_requests
    assert list(data.new_tokens) == [5] and list(data.new_block_ids_by_group[0]) == [9]
    assert list(data.num_replaced_blocks_by_group) == [1]


@pytest.mark.parametrize("order", ["connector first", "table first", "connector skips", "table skips"])
def test_each_reader_sees_each_change_once(backend, order):
    pytest.importorskip("torch", reason="the device block table is a torch tensor (pip install torch==2.13.0)")
    manager, store = SchedulerOutputManager(), OffloadStore()
    preparer = InputPreparer(8, 2, block_size=4, max_blocks_per_seq=8, max_slots=2)
    request = generating(backend, 1, 6, 2)
    table = request.block_tables[0]
    sent = []
    for step in range(6):
        request.add_new_token(step)
        if step == 2:
            table.truncate(1)  # rewind: blocks freed ...
            table.extend([40, 41])  # ... and re-allocated
        elif request.get_num_tokens(0) + 1 > 4 * len(table):
            table.append(50 + step)
        readers = ["connector", "table"] if order != "table first" else ["table", "connector"]
        if order == "connector skips" and step % 2:
            readers.remove("connector")
        if order == "table skips" and step % 2:
            readers.remove("table")
        for reader in readers:
            if reader == "connector":
                report(manager, store, [request])
                store.check(request)
            else:
                preparer.prepare([], [request])
                sent.append(preparer._host[0].metadata.bound().num_changed_entries
                            + preparer._host[-1].metadata.bound().num_changed_entries)
                assert preparer.block_table[0, 0, : len(table)].tolist() == table.tolist()
                assert preparer.block_table[0, 0, len(table) :].eq(0).all()
    assert sent


def test_pickles_carry_both_marks(backend):
    request = generating(backend, 3, 4, 3)
    manager, store = SchedulerOutputManager(), OffloadStore()
    report(manager, store, [request])
    request.block_tables[0][2] = 7
    copy = pickle.loads(pickle.dumps(request))
    restored = copy.block_tables[0]
    assert restored.__reduce__()[1][3:] == (2, 0)  # (connector's mark, device table's mark)
    report(manager, store, [copy])
    store.check(copy)
    # an older pickle (no device-table mark) still loads: the device table sends it whole
    old = _pickle.restore_block_table(None, [1, 2], 0, 1)
    assert old.tolist() == [1, 2] and old.__reduce__()[1][3:] == (1, 0)
