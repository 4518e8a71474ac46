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


def test_a_large_write_owns_its_storages_while_another_thread_grows_the_requests(backend):
    """A context chunk of 40,000 tokens (a write large enough to release the GIL) while a
    second thread keeps appending to the same requests, which replaces their storage:
    the chunk rows are the prompt, every time."""
    prompt = (np.arange(40_000, dtype=np.int32) * 7) % 30_011
    requests = [backend.Request(index, prompt + index) for index in range(2)]
    for request in requests:
        request.context_chunk_size = 20_000
    stop = threading.Event()

    def grow():
        while not stop.is_set():
            for request in requests:
                view = request.get_tokens_view(0)  # as above: each append replaces and frees the storage
                request.add_new_token(1)
                del view
                request.truncate(40_000)

    worker = threading.Thread(target=grow)
    out = HostBuffers(40_000, 2)
    worker.start()
    try:
        for _ in range(20):
            inputs = prepare_inputs(requests, [], out=out)
            assert np.array_equal(inputs.input_ids[:20_000], prompt[:20_000])
            assert np.array_equal(inputs.input_ids[20_000:], prompt[:20_000] + 1)
            assert inputs.gather_ids.tolist() == [19_999, 39_999]
    finally:
        stop.set()
        worker.join()
