/* The floor of the attention scenario's step: what InputPreparer.prepare does on the host
 * with a block size, as plain C over C arrays (part of tokcy.bench._floor, _floor.c).
 *
 * Per step: the scenario's touch (one table in `every` has its last block id rewritten),
 * then per request the token row prepare_inputs writes and, per layer group, the slot, the
 * CSR offset and last-page length, what the device gather reads, and the device-table
 * entries of a table that changed since its row was last sent; every array lies in one
 * packed int32 buffer laid out as InputPreparer lays out its staging buffer (the same
 * offsets, capacities and alignment), and the step copies its used prefix, the changed
 * entries after the input ids, to a second buffer (the device's, on a CPU). Each request
 * and each block table's ids are separate heap allocations, in a shuffled order. */
#include "_floor.h"

#define MAX_GROUPS 2

typedef struct {
    int32_t *ids;          /* the block ids */
    int64_t num_blocks;
    int64_t num_released;
    int64_t stamp;         /* bumped by every change of the table */
    int64_t dirty_from;    /* the first entry changed since the table was last sent */
} FloorTable;

typedef struct {
    int32_t *tokens;
    int64_t num_tokens;
    int64_t request_id;
    int32_t prompt_len;
    int32_t slot;          /* its row of the device table */
    FloorTable tables[MAX_GROUPS];
} AttentionRequest;

typedef struct {  /* int32 word offsets into the packed buffer (InputPreparer's _packed_layout) */
    int64_t kv_lens, cu_kv_seqlens, table_slots;
    int64_t kv_indptr[MAX_GROUPS], kv_last_page_len[MAX_GROUPS], slot_mapping[MAX_GROUPS];
    int64_t gather_blocks[MAX_GROUPS], gather_live[MAX_GROUPS], gather_base[MAX_GROUPS];
    int64_t cu_seqlens, request_ids, seq_lens, num_cached_tokens, prompt_lens, gather_ids, position_ids, input_ids;
    int64_t total;         /* words, the delta area included */
} Layout;

/* The next array of `length` entries of `width` words; int64 arrays and input_ids start on
 * an even word. */
static int64_t place(int64_t *offset, int64_t length, int width, int even) {
    if ((width == 2 || even) && (*offset & 1)) (*offset)++;
    int64_t at = *offset;
    *offset += length * width;
    return at;
}

/* InputPreparer(B, B, block_sizes=(...) * groups, max_blocks_per_seq=width, max_slots=B). */
static Layout layout_for(int64_t batch, int groups, int64_t width) {
    Layout at;
    int64_t offset = 0;
    at.kv_lens = place(&offset, batch, 1, 0);
    at.cu_kv_seqlens = place(&offset, batch + 1, 1, 0);
    at.table_slots = place(&offset, batch, 1, 0);
    for (int g = 0; g < groups; g++) {
        at.kv_indptr[g] = place(&offset, batch + 1, 1, 0);
        at.kv_last_page_len[g] = place(&offset, batch, 1, 0);
        at.slot_mapping[g] = place(&offset, batch, 2, 0);
        at.gather_blocks[g] = place(&offset, batch, 1, 0);
        at.gather_live[g] = place(&offset, batch, 2, 0);
        at.gather_base[g] = place(&offset, batch, 2, 0);
    }
    at.cu_seqlens = place(&offset, batch + 1, 1, 0);
    at.request_ids = place(&offset, batch, 2, 0);
    at.seq_lens = place(&offset, batch, 1, 0);
    at.num_cached_tokens = place(&offset, batch, 1, 0);
    at.prompt_lens = place(&offset, batch, 1, 0);
    place(&offset, batch, 1, 0);  /* draft_lens */
    place(&offset, batch, 1, 0);  /* device_token_slots (no draft tokens: max_draft_len 0) */
    at.gather_ids = place(&offset, batch, 1, 0);
    at.position_ids = place(&offset, batch, 1, 0);
    at.input_ids = place(&offset, batch, 1, 1);
    offset += 1 + 3 * batch * groups * width;  /* the changed entries, after the used ids */
    at.total = offset + (offset & 1);
    return at;
}

typedef struct {
    AttentionRequest **requests;
    Py_ssize_t count;
    int groups;
    int64_t block_size[MAX_GROUPS];
    int shift[MAX_GROUPS];         /* log2(block size), -1 if not a power of two */
    int64_t width, every, step, last_stamp;
    int32_t max_query_len, max_kv_len;  /* as tokcy's results() */
    int64_t *row_stamps;           /* per device-table row: the stamp of the table it holds */
    int64_t *changed_index;        /* one step's changed entries, gathered in the loop */
    int32_t *changed_value;
    Layout at;
    int32_t *staging, *device;
} AttentionWorld;

static inline int64_t block_of(int64_t position, int64_t block_size, int shift) {
    return shift >= 0 ? position >> shift : position / block_size;
}

/* One step of the world `state`; returns the bytes copied. */
static int64_t attention_once(void *state) {
    AttentionWorld *w = state;
    const Layout *at = &w->at;
    int32_t *p = w->staging;
    int64_t batch = w->count, changed = 0, kv_sum = 0, live_sum[MAX_GROUPS] = {0, 0};
    int32_t max_kv_len = 0;
    w->step++;
    for (int64_t i = w->step % w->every; i < batch; i += w->every) {  /* the touch */
        FloorTable *t = &w->requests[i]->tables[0];
        ((volatile int32_t *)t->ids)[t->num_blocks - 1] = t->ids[t->num_blocks - 1];  /* stored, as tokcy's */
        t->stamp = ++w->last_stamp;
        if (t->dirty_from > t->num_blocks - 1) t->dirty_from = t->num_blocks - 1;
    }
    p[at->cu_seqlens] = p[at->cu_kv_seqlens] = 0;
    for (int g = 0; g < w->groups; g++) p[at->kv_indptr[g]] = 0;
    for (int64_t i = 0; i < batch; i++) {
        AttentionRequest *r = w->requests[i];
        int64_t n = r->num_tokens, pos = n - 1;
        p[at->input_ids + i] = r->tokens[pos];
        p[at->position_ids + i] = (int32_t)pos;
        p[at->gather_ids + i] = (int32_t)i;
        p[at->seq_lens + i] = 1;
        p[at->num_cached_tokens + i] = (int32_t)pos;
        p[at->prompt_lens + i] = r->prompt_len;
        ((int64_t *)(p + at->request_ids))[i] = r->request_id;
        p[at->cu_seqlens + i + 1] = (int32_t)(i + 1);
        kv_sum += n;
        p[at->kv_lens + i] = (int32_t)n;
        if (n > max_kv_len) max_kv_len = (int32_t)n;
        p[at->cu_kv_seqlens + i + 1] = (int32_t)kv_sum;
        p[at->table_slots + i] = r->slot;
        for (int g = 0; g < w->groups; g++) {
            FloorTable *t = &r->tables[g];
            int64_t size = w->block_size[g], block = block_of(pos, size, w->shift[g]);
            int64_t live = block + 1 - t->num_released, row = (int64_t)g * batch + r->slot;
            live_sum[g] += live;
            ((int64_t *)(p + at->slot_mapping[g]))[i] = (int64_t)t->ids[block] * size + pos - block * size;
            p[at->kv_indptr[g] + i + 1] = (int32_t)live_sum[g];
            p[at->kv_last_page_len[g] + i] = (int32_t)(n - block * size);
            p[at->gather_blocks[g] + i] = (int32_t)(block + 1);
            ((int64_t *)(p + at->gather_live[g]))[i] = live;
            ((int64_t *)(p + at->gather_base[g]))[i] = (int64_t)r->slot * w->width + block + 1 - live_sum[g];
            if (t->stamp != w->row_stamps[row]) {  /* the entries its row lacks */
                for (int64_t j = t->dirty_from; j < t->num_blocks; j++) {
                    w->changed_index[changed] = row * w->width + j;
                    w->changed_value[changed++] = t->ids[j];
                }
                w->row_stamps[row] = t->stamp;
                t->dirty_from = t->num_blocks;
            }
        }
    }
    w->max_kv_len = max_kv_len;
    w->max_query_len = batch ? 1 : 0;
    /* the used ids, then (from an even word) the changed entries' int64 indices and int32 values */
    int64_t used = at->input_ids + batch;
    if (changed) {
        int64_t start = at->input_ids + batch + (batch & 1);
        memcpy(p + start, w->changed_index, (size_t)changed * sizeof(int64_t));
        memcpy(p + start + 2 * changed, w->changed_value, (size_t)changed * sizeof(int32_t));
        used = start + 3 * changed;
    }
    memcpy(w->device, p, (size_t)used * sizeof(int32_t));
    return used * (int64_t)sizeof(int32_t);
}

static void free_world(AttentionWorld *w, void **spacers) {
    if (w->requests) {
        for (Py_ssize_t i = 0; i < w->count; i++) {
            AttentionRequest *r = w->requests[i];
            if (!r) continue;
            colored_free(r->tokens);
            for (int g = 0; g < MAX_GROUPS; g++) colored_free(r->tables[g].ids);
            free(r);
        }
    }
    if (spacers) {
        for (Py_ssize_t i = 0; i < w->count; i++) free(spacers[i]);
    }
    free(spacers);
    free(w->requests);
    free(w->row_stamps);
    free(w->changed_index);
    free(w->changed_value);
    free(w->staging);
    free(w->device);
}

/* The batch, its requests allocated in a shuffled order with a spacer between them; every
 * table full and its row already sent (the steady state). 0, or -1 out of memory. */
static int make_world(AttentionWorld *w, void ***spacers, int64_t seq_len) {
    Py_ssize_t count = w->count;
    Py_ssize_t *order = shuffled_order(count);
    w->requests = calloc((size_t)count + 1, sizeof(AttentionRequest *));
    *spacers = calloc((size_t)count + 1, sizeof(void *));
    if (!order || !w->requests || !*spacers) goto fail;
    for (Py_ssize_t k = 0; k < count; k++) {
        Py_ssize_t i = order[k];
        AttentionRequest *r = calloc(1, sizeof(AttentionRequest));
        if (!r) goto fail;
        w->requests[i] = r;
        r->tokens = colored_malloc((size_t)seq_len * sizeof(int32_t));
        (*spacers)[k] = malloc(64 + (next_random() % 512));
        if (!r->tokens || !(*spacers)[k]) goto fail;
        /* the scenario's prompt holds j % 50000 at position j; a decode step reads only the
         * newest token, so only it is written: the storage of the others stays untouched
         * (uncommitted pages for long ones), so that a round's set-up does not sweep the
         * caches and the TLB between two of tokcy's rounds */
        r->tokens[seq_len - 1] = (int32_t)((seq_len - 1) % 50000);
        r->num_tokens = seq_len;
        r->prompt_len = (int32_t)seq_len;  /* the scenario's requests: all prompt, one row each */
        r->request_id = i;
        r->slot = (int32_t)(count - 1 - i);  /* the scenario's slots: the batch's order reversed */
        for (int g = 0; g < w->groups; g++) {
            FloorTable *t = &r->tables[g];
            t->ids = colored_malloc((size_t)w->width * sizeof(int32_t));
            if (!t->ids) goto fail;
            /* the scenario's ids; as with the tokens, only those a step reads are written: the
             * current block's (the slot) and the last (the touch, the changed entry) */
            for (int64_t j = (seq_len - 1) / w->block_size[g]; j < w->width; j++)
                t->ids[j] = (int32_t)(((int64_t)g * count + i) * w->width + j);
            t->num_blocks = t->dirty_from = w->width;
            t->stamp = 1;
        }
    }
    free(order);
    w->row_stamps = malloc((size_t)(count * w->groups + 1) * sizeof(int64_t));
    w->changed_index = malloc((size_t)(count * w->groups * w->width + 1) * sizeof(int64_t));
    w->changed_value = malloc((size_t)(count * w->groups * w->width + 1) * sizeof(int32_t));
    w->staging = calloc((size_t)w->at.total, sizeof(int32_t));  /* 16-byte aligned: int64 views fit */
    w->device = calloc((size_t)w->at.total, sizeof(int32_t));
    if (!w->row_stamps || !w->changed_index || !w->changed_value || !w->staging || !w->device) return -1;
    for (Py_ssize_t row = 0; row < count * w->groups; row++) w->row_stamps[row] = 1;
    w->last_stamp = 1;
    return 0;
fail:
    free(order);
    return -1;
}

/* The world of a call's sizes, built (0; free_world() it), or -1 with the exception set and
 * nothing left allocated. */
static int setup_world(AttentionWorld *w, void ***spacers, Py_ssize_t count, Py_ssize_t seq_len,
                       Py_ssize_t block_size, Py_ssize_t groups, Py_ssize_t every) {
    if (count < 1 || seq_len < 1 || block_size < 1 || groups < 1 || groups > MAX_GROUPS || every < 1) {
        PyErr_SetString(PyExc_ValueError, "num_requests, seq_len, block_size and every must be >= 1, "
                                          "num_groups 1 or 2");
        return -1;
    }
    memset(w, 0, sizeof(*w));
    w->count = count;
    w->groups = (int)groups;
    w->every = every;
    w->width = (seq_len + block_size) / block_size;  /* ceil((seq_len + 1) / block_size): room for the next token */
    if ((int64_t)count * groups * w->width > INT32_MAX) {  /* as DeviceTableRows refuses */
        PyErr_SetString(PyExc_ValueError, "the device table would hold 2**31 entries or more");
        return -1;
    }
    for (int g = 0; g < w->groups; g++) {
        w->block_size[g] = block_size;
        w->shift[g] = -1;
        if ((block_size & (block_size - 1)) == 0)
            for (w->shift[g] = 0; ((int64_t)1 << w->shift[g]) != block_size; w->shift[g]++) {}
    }
    w->at = layout_for(count, w->groups, w->width);
    if (make_world(w, spacers, seq_len) < 0) {
        free_world(w, *spacers);
        *spacers = NULL;
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

const char floor_attention_doc[] =
"attention(num_requests, seq_len, block_size, num_groups, every, reps, rounds)\n"
"    -> (seconds per step per round, bytes copied)\n\n"
"The host side of InputPreparer.prepare with a block size for num_requests decode\n"
"requests of seq_len tokens whose tables hold every block (num_groups layer groups of\n"
"block_size, at most 2), one table in `every` touched per step, in C, timed over `reps`\n"
"steps per round. `bytes copied`: what the timed steps copied to the device, all together.";

PyObject *floor_attention(PyObject *self, PyObject *args) {
    Py_ssize_t count, seq_len, block_size, groups, every, reps, rounds;
    if (!PyArg_ParseTuple(args, "nnnnnnn", &count, &seq_len, &block_size, &groups, &every, &reps, &rounds))
        return NULL;
    if (check_sizes(count, seq_len, block_size, reps, rounds) < 0) return NULL;
    AttentionWorld w;
    void **spacers = NULL;
    double *seconds = malloc((size_t)rounds * sizeof(double));
    PyObject *result = NULL;
    int64_t copied = 0;
    if (!seconds) {
        PyErr_NoMemory();
        return NULL;
    }
    if (setup_world(&w, &spacers, count, seq_len, block_size, groups, every) < 0) goto done;
    Py_BEGIN_ALLOW_THREADS
    copied = time_calls(attention_once, &w, reps, rounds, seconds);
    Py_END_ALLOW_THREADS
    result = timed_result(seconds, rounds, copied);
    free_world(&w, spacers);
done:
    free(seconds);
    return result;
}

const char floor_attention_buffer_doc[] =
"attention_buffer(num_requests, seq_len, block_size, num_groups, every, steps) -> bytes\n\n"
"What attention()'s world copied to the device at its last of `steps` steps (for the\n"
"tests: the same bytes as InputPreparer's device buffer after as many steps).";

PyObject *floor_attention_buffer(PyObject *self, PyObject *args) {
    Py_ssize_t count, seq_len, block_size, groups, every, steps;
    if (!PyArg_ParseTuple(args, "nnnnnn", &count, &seq_len, &block_size, &groups, &every, &steps)) return NULL;
    if (check_sizes(count, seq_len, block_size, steps, 1) < 0) return NULL;
    AttentionWorld w;
    void **spacers = NULL;
    int64_t copied = 0;
    if (setup_world(&w, &spacers, count, seq_len, block_size, groups, every) < 0) return NULL;
    for (Py_ssize_t step = 0; step < steps; step++) copied = attention_once(&w);
    PyObject *result = PyBytes_FromStringAndSize((const char *)w.device, (Py_ssize_t)copied);
    free_world(&w, spacers);
    return result;
}
