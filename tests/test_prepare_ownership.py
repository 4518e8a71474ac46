"""What a prepare call reads stays alive and unchanged until it has written the rows.

``prepare_inputs`` plans and writes in one call. A small write keeps the GIL and borrows
the requests' storage arrays (the call holds the batch's request sequences instead); a
large one takes a reference to every storage before it releases the GIL. These tests
make Python code run at the moments that would break either rule (a request's
``__del__`` when the batch is dropped, a second thread while the rows are copied) and
check the rows exactly. Under the sanitizer build (.ci/sanitize.sh) a broken rule shows
as an AddressSanitizer report.
"""

import threading

import numpy as np

from tokcy import RequestState
from tokcy.executor import HostBuffers, prepare_inputs


def generation(request):
    request.state = RequestState.GENERATION_IN_PROGRESS
    return request


def test_requests_only_the_batch_owns_die_after_the_rows_are_written(backend):
    """Each request of a generator batch has a ``__del__`` that grows a survivor request
    (its storage is replaced and the old one freed): it may run only after the write,
    so every row, the survivor's included, is the plan-time token."""
    survivor = generation(backend.Request(0, [5, 6, 7]))
    deaths = []

    class Dying(backend.Request):
        def __del__(self):
            deaths.append(self.request_id)
            view = survivor.get_tokens_view(0)  # the next write copies: the old storage is then the view's
            survivor.add_new_token(100 + self.request_id)
            del view  # frees the old storage, which no one else holds

    def batch():
        yield survivor
        for index in range(1, 9):
            yield generation(Dying(index, [10 * index + 1, 10 * index + 2]))

    out = HostBuffers(16, 16)
    for _ in range(5):
        before = survivor.get_num_tokens(0)
        last = survivor.get_last_tokens()[0]
        inputs = prepare_inputs([], batch(), out=out)
        assert inputs.input_ids.tolist() == [last] + [10 * index + 2 for index in range(1, 9)]
        assert inputs.position_ids.tolist() == [before - 1] + [1] * 8
        assert inputs.request_ids.tolist() == list(range(9))
    assert sorted(deaths) == sorted(list(range(1, 9)) * 5)


def test_a_request_dying_with_the_batch_cannot_reenter_the_writer_that_drops_it(backend):
    """Requests whose ``__del__`` calls ``prepare_inputs`` again on the same buffers, with a
    block size: they die while the outer call drops its batch, after its rows and metadata
    are written, while its writer is still busy; each inner call is refused, the outer
    rows are exact and the buffers serve the next call."""
    out = HostBuffers(16, 16, max_blocks_per_seq=4)
    survivor = generation(backend.Request(0, [5, 6, 7]))
    survivor.block_tables[0].append(9)
    refused = []

    class Dying(backend.Request):
        def __del__(self):
            try:
                prepare_inputs([], [survivor], out=out, block_size=4)
                refused.append("ran")
            except RuntimeError as error:
                refused.append(str(error))

    def batch():
        yield survivor
        for index in range(1, 4):
            request = generation(Dying(index, list(range(10 * index, 10 * index + 5))))
            request.block_tables[0].extend([index, 10 + index])
            yield request

    inputs = prepare_inputs([], batch(), out=out, block_size=4)
    assert refused == ["this InputWriter is in use by another call (another thread's, or one re-entered from "
                       "code this call runs)"] * 3
    assert inputs.input_ids.tolist() == [7, 14, 24, 34]
    assert inputs.kv_lens.tolist() == [3, 5, 5, 5]
    # position 4 of each dying request is the first entry of its second block (10 + index)
    assert inputs.groups[0].slot_mapping.tolist() == [9 * 4 + 2, 11 * 4, 12 * 4, 13 * 4]
    assert inputs.groups[0].kv_indices.tolist() == [9, 1, 11, 2, 12, 3, 13]
    again = prepare_inputs([], [survivor], out=out, block_size=4)
    assert again.input_ids.tolist() == [7] and again.groups[0].slot_mapping.tolist() == [38]


# a chunk this long makes a write large enough to release the GIL (the compiled writer
# releases it from 256 Ki written entries: two chunks are 300,000 token rows)
CHUNK = 150_000


def test_a_large_write_owns_its_storages_while_another_thread_replaces_them(backend):
    """Eight context chunks of 150,000 tokens (a write large enough to release the GIL)
    while a second thread keeps replacing the last request's token storage, which the
    write reads last: each of its rounds rewrites the generated token below a view it
    holds (so the buffer copies itself into new storage) and drops the view, which frees
    the storage the write may be reading. The chunk rows are the prompts, every time."""
    prompt = (np.arange(2 * CHUNK, dtype=np.int32) * 7) % 30_011
    requests = []
    for index in range(8):
        request = backend.Request(index, prompt + index)
        request.add_new_token(5)
        request.context_chunk_size = CHUNK
        requests.append(request)
    target = requests[-1]
    stop = threading.Event()
    rounds = []

    def replace():
        while not stop.is_set():
            view = target.get_tokens_view(0)
            target.truncate(2 * CHUNK)
            target.add_new_token(5)  # written below the view: new storage, same tokens
            del view  # the old storage freed
            rounds.append(None)

    worker = threading.Thread(target=replace)
    out = HostBuffers(8 * CHUNK, 8)
    worker.start()
    try:
        for _ in range(10):
            inputs = prepare_inputs(requests, [], out=out)
            for index in range(8):
                assert np.array_equal(inputs.input_ids[index * CHUNK : (index + 1) * CHUNK], prompt[:CHUNK] + index)
            assert inputs.gather_ids.tolist() == [(index + 1) * CHUNK - 1 for index in range(8)]
    finally:
        stop.set()
        worker.join()
    assert rounds  # the other thread ran


def test_a_large_write_owns_the_block_tables_while_another_thread_replaces_them(backend):
    """The same with the attention metadata: two chunks of 150,000 tokens with block size 16
    (9,375 blocks each), written without the GIL while a second thread keeps replacing the
    tables' storage (an id rewritten with its own value below a view held, then the view
    dropped): the slots, the CSR and the dense rows are the planned blocks, every time."""
    block_size, num_blocks = 16, CHUNK // 16
    requests = []
    for index in range(2):
        request = backend.Request(index, np.arange(CHUNK, dtype=np.int32))
        request.context_chunk_size = CHUNK
        request.block_tables[0].extend(np.arange(num_blocks, dtype=np.int32) * 2 + index)
        requests.append(request)
    stop = threading.Event()
    rounds = []

    def replace():
        while not stop.is_set():
            for request in requests:
                table = request.block_tables[0]
                view = table.view()
                table[0] = table[0]  # written below the view: new storage, same ids
                del view  # the old storage freed
            rounds.append(None)

    out = HostBuffers(2 * CHUNK, 2, max_blocks_per_seq=num_blocks + 1)
    blocks = [np.arange(num_blocks, dtype=np.int64) * 2 + index for index in range(2)]
    slots = np.concatenate([np.repeat(ids, block_size) * block_size + np.tile(np.arange(block_size), num_blocks)
                            for ids in blocks])
    worker = threading.Thread(target=replace)
    worker.start()
    try:
        for _ in range(10):
            inputs = prepare_inputs(requests, [], out=out, block_size=block_size)
            group = inputs.groups[0]
            assert np.array_equal(group.slot_mapping, slots)
            assert np.array_equal(group.kv_indices, np.concatenate(blocks))
            assert group.kv_indptr.tolist() == [0, num_blocks, 2 * num_blocks]
            assert np.array_equal(group.block_table[:, :num_blocks], np.stack(blocks))
            assert not group.block_table[:, num_blocks:].any()
    finally:
        stop.set()
        worker.join()
    assert rounds
