# Binding the attention metadata's outputs (compiled): the arrays AttentionMetadata.bind()
# and bind_device_table() take, checked by the twin's checks in its order, their memory
# recorded (bound_memory) and every pointer taken before anything changes, so that a
# refused array leaves the metadata bound to the arrays it had. What was bound before is
# released only on return, once no pointer is into it.


cdef int bind_outputs(AttentionMetadata meta, object max_blocks_per_seq, object kv_lens, object cu_kv_seqlens,
                      object slot_mapping, object kv_indptr, object kv_last_page_len, object block_table,
                      object kv_indices) except -1:
    """AttentionMetadata.bind()."""
    cdef Py_ssize_t group, count, width
    cdef int32_t[:, ::1] dense
    cdef int64_t* slots[MAX_LAYER_GROUPS]
    cdef int32_t* indptr[MAX_LAYER_GROUPS]
    cdef int32_t* last_page_len[MAX_LAYER_GROUPS]
    cdef int32_t* tables[MAX_LAYER_GROUPS]
    cdef int32_t* indices[MAX_LAYER_GROUPS]
    cdef Py_ssize_t cap_indices[MAX_LAYER_GROUPS]
    cdef int32_t* lens
    cdef int32_t* cu_lens
    cdef Py_ssize_t cap_tokens = -1, cap_seqs, length, cu_length
    if meta.busy:
        _checks.metadata_busy()
    # busy for the whole call: the checks read the arrays' attributes, which may run
    # Python code that lets another thread in; a writer's call then is refused, as one
    # whose second pass may be writing these outputs without the GIL must not see them swapped
    meta.busy = True
    try:
        # the groups' sequences as tuples first: what the checks count is what is bound
        # (a sequence's len() may change between two calls)
        slot_mapping, kv_indptr, kv_last_page_len = tuple(slot_mapping), tuple(kv_indptr), tuple(kv_last_page_len)
        block_table = None if block_table is None else tuple(block_table)
        kv_indices = None if kv_indices is None else tuple(kv_indices)
        # the twin's checks, in its order
        width = _checks.check_metadata_arrays(max_blocks_per_seq, kv_lens, cu_kv_seqlens, slot_mapping, kv_indptr,
                                              kv_last_page_len, block_table, kv_indices)
        count = len(slot_mapping)
        arrays = (kv_lens, cu_kv_seqlens, slot_mapping, kv_indptr, kv_last_page_len, block_table, kv_indices)
        # what keeps their memory where it is, and what every write checks of it: made
        # before any pointer is taken
        given, names = _checks.named_arrays(
            kv_lens=kv_lens, cu_kv_seqlens=cu_kv_seqlens, slot_mapping=slot_mapping, kv_indptr=kv_indptr,
            kv_last_page_len=kv_last_page_len, block_table=block_table, kv_indices=kv_indices)
        bound = bound_memory(given, names)
        # every pointer taken (each array checked) before anything changes: a bad array
        # leaves the writer bound to its old arrays, which it still owns
        # through plain views (int32_pointer()): their buffers are numpy's, over memory
        # ``bound`` keeps (a subclass's __buffer__ may export another)
        lens = int32_pointer(kv_lens, &length, bound)
        cu_lens = int32_pointer(cu_kv_seqlens, &cu_length, bound)
        cap_seqs = min(length, cu_length - 1)
        for group in range(count):
            slots[group] = int64_pointer(arrays[2][group], &length, bound)
            cap_tokens = length if cap_tokens < 0 else min(cap_tokens, length)
            indptr[group] = int32_pointer(arrays[3][group], &length, bound)
            cap_seqs = min(cap_seqs, length - 1)
            last_page_len[group] = int32_pointer(arrays[4][group], &length, bound)
            cap_seqs = min(cap_seqs, length)
            if block_table is None:
                tables[group] = NULL
                indices[group] = NULL
                cap_indices[group] = -1
            else:
                dense = NDARRAY.view(arrays[5][group], NDARRAY)  # as int32_pointer()
                if dense.shape[1] != width:  # (the check above read .shape, which a subclass may fake)
                    _checks.dense_columns(group, width, dense.shape[1])
                tables[group] = &dense[0, 0] if dense.shape[0] else NULL
                check_still_over(arrays[5][group], tables[group])
                bound.check_taken(arrays[5][group], tables[group])
                cap_seqs = min(cap_seqs, dense.shape[0])
                indices[group] = int32_pointer(arrays[6][group], &cap_indices[group], bound)
        meta.release()
        # what was bound is released on return, once no pointer is into it
        retired = (meta._arrays, meta._bound_memory, meta._device_arrays, meta._device_memory, meta.rows)
        # the device table's arrays were sized with the old ones (cap_seqs): unbound with them
        meta.has_device_table = False
        meta.rows = None
        meta._device_arrays = None
        meta._device_memory = None
        meta._arrays = arrays
        meta._bound_memory = bound
        meta.width = width
        meta.kv_lens = lens
        meta.cu_kv_seqlens = cu_lens
        meta.cap_tokens = cap_tokens
        meta.cap_seqs = cap_seqs
        for group in range(count):
            meta.slot_mapping[group] = slots[group]
            meta.kv_indptr[group] = indptr[group]
            meta.kv_last_page_len[group] = last_page_len[group]
            meta.block_table[group] = tables[group]
            meta.kv_indices[group] = indices[group]
            meta.cap_indices[group] = cap_indices[group]
        meta.num_bound_groups = count
        meta._block_sizes = None
    finally:
        meta.busy = False
    return 0


cdef int bind_device_outputs(AttentionMetadata meta, object rows, object table_slots, object delta_area,
                             object gather_blocks, object gather_live, object gather_base) except -1:
    """AttentionMetadata.bind_device_table()."""
    cdef Py_ssize_t group, count = meta.num_bound_groups
    cdef int32_t* blocks[MAX_LAYER_GROUPS]
    cdef int64_t* live[MAX_LAYER_GROUPS]
    cdef int64_t* base[MAX_LAYER_GROUPS]
    cdef int32_t* slots
    cdef int32_t* deltas
    cdef Py_ssize_t cap_seqs, length, delta_capacity
    if meta.busy:
        _checks.metadata_busy()
    # busy for the whole call, as bind()
    meta.busy = True
    try:
        if meta._arrays is None:
            raise RuntimeError("bind() the metadata arrays first")
        if not isinstance(rows, DeviceTableRows):
            raise TypeError(f"Argument 'rows' has incorrect type (expected tokcy._core.DeviceTableRows, "
                            f"got {type(rows).__name__})")
        if (<DeviceTableRows>rows).num_groups != count or (<DeviceTableRows>rows).width != meta.width:
            raise ValueError(f"the device table has {rows.num_groups} groups of {rows.width} columns, "
                             f"the outputs {count} of {meta.width}")
        gathers = (tuple(gather_blocks), tuple(gather_live), tuple(gather_base))  # counted as bound (see bind())
        if len(gathers[0]) != count or len(gathers[1]) != count or len(gathers[2]) != count:
            raise ValueError("one gather_blocks, gather_live and gather_base per layer group")
        _checks.check_device_table_arrays(table_slots, delta_area, gathers)  # the twin's checks and order
        given, names = _checks.named_arrays(
            table_slots=table_slots, delta_area=delta_area, gather_blocks=gathers[0], gather_live=gathers[1],
            gather_base=gathers[2])
        bound = bound_memory(given, names)  # as bind()
        slots = int32_pointer(table_slots, &length, bound)
        cap_seqs = min(meta.cap_seqs, length)
        deltas = int32_pointer(delta_area, &delta_capacity, bound)
        if <uintptr_t>deltas % 8:  # (checked above through .ctypes, which a subclass may fake)
            _checks.misaligned_delta_area()
        for group in range(count):  # every pointer taken (each array checked) before anything changes
            blocks[group] = int32_pointer(gathers[0][group], &length, bound)
            cap_seqs = min(cap_seqs, length)
            live[group] = int64_pointer(gathers[1][group], &length, bound)
            cap_seqs = min(cap_seqs, length)
            base[group] = int64_pointer(gathers[2][group], &length, bound)
            cap_seqs = min(cap_seqs, length)
        meta.release()
        retired = (meta._device_arrays, meta._device_memory, meta.rows)  # released on return, once unused
        meta.rows = rows
        meta._device_arrays = (table_slots, delta_area, gathers)
        meta._device_memory = bound
        meta.table_slots = slots
        meta.delta_area = deltas
        meta.cap_seqs = cap_seqs
        for group in range(count):
            meta.gather_blocks[group] = blocks[group]
            meta.gather_live[group] = live[group]
            meta.gather_base[group] = base[group]
        meta.delta_capacity = delta_capacity
        meta.max_slots = rows.max_slots
        meta.has_device_table = True
    finally:
        meta.busy = False
    return 0
