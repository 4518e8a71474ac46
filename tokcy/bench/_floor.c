/* The floor: the work of tokcy's hot loops written as plain C over C arrays (the attention
 * metadata's in _floor_attention.c).
 *
 * A private benchmark helper (not tokcy's API). Each function builds its own batch in C
 * (every request a separate heap object with its own token storage, allocated in a
 * shuffled order so that neighbours in the batch are not neighbours in memory, as
 * tokcy's requests and numpy buffers are), then times the loop with clock_gettime over
 * many repetitions and returns seconds per call for each round. No Python runs inside
 * the timed region. The outputs are the same arrays, dtypes and bytes tokcy writes.
 */
#include "_floor.h"

typedef struct {
    int32_t *tokens;       /* beam 0 */
    int64_t num_tokens;
    int64_t capacity;
    int32_t *blocks;       /* layer group 0 */
    int64_t num_blocks;
    int64_t block_capacity;
    int32_t drafts[8];
    int64_t num_drafts;
    int64_t request_id;
    int32_t prompt_len;
    int64_t context_position;
    int64_t chunk;
} FloorRequest;

typedef struct {  /* what the connector has reported per request (kept by slot) */
    int64_t num_tokens;
    int64_t num_blocks;
} FloorSlot;

FLOOR_INTERNAL double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static uint64_t rng_state = 88172645463325252ULL;
FLOOR_INTERNAL uint64_t next_random(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

/* as new_storage(): from 16 KiB, up to 64 colors of one 64-byte line, at most a sixteenth
 * of the buffer; the block malloc gave is kept in a 64-byte header before the memory
 * handed out (which stays as aligned as malloc's, 16 bytes) */
#define COLOR_HEADER 64
static size_t next_color = 0;
FLOOR_INTERNAL void *colored_malloc(size_t bytes) {
    size_t offset = 0, colors = bytes / (16 * 64);
    if (bytes >= 16 * 1024) {
        offset = (next_color % (colors < 64 ? colors : 64)) * 64;
        next_color = (next_color + 1) % 64;
    }
    char *block = malloc(bytes + offset + COLOR_HEADER);
    if (!block) return NULL;
    char *memory = block + COLOR_HEADER + offset;
    memcpy(memory - sizeof(void *), &block, sizeof(void *));
    return memory;
}

FLOOR_INTERNAL void colored_free(void *memory) {
    char *block;
    if (!memory) return;
    memcpy(&block, (char *)memory - sizeof(void *), sizeof(void *));
    free(block);
}

static void free_requests(FloorRequest **requests, Py_ssize_t count, void **spacers);

FLOOR_INTERNAL Py_ssize_t *shuffled_order(Py_ssize_t count) {
    Py_ssize_t *order = malloc((size_t)(count > 0 ? count : 1) * sizeof(Py_ssize_t));
    if (!order) return NULL;
    for (Py_ssize_t i = 0; i < count; i++) order[i] = i;
    for (Py_ssize_t i = count - 1; i > 0; i--) {
        Py_ssize_t j = (Py_ssize_t)(next_random() % (uint64_t)(i + 1)), swap = order[i];
        order[i] = order[j];
        order[j] = swap;
    }
    return order;
}

/* B requests allocated in a shuffled order, with a spacer allocation between them. */
static FloorRequest **make_requests(Py_ssize_t count, int64_t capacity, int64_t block_capacity, void ***spacers) {
    FloorRequest **requests = calloc((size_t)count, sizeof(FloorRequest *));
    Py_ssize_t *order = shuffled_order(count);
    *spacers = calloc((size_t)count, sizeof(void *));
    if (!requests || !order || !*spacers) goto fail;
    for (Py_ssize_t k = 0; k < count; k++) {
        FloorRequest *request = calloc(1, sizeof(FloorRequest));
        if (!request) goto fail;
        requests[order[k]] = request;
        request->tokens = colored_malloc((size_t)capacity * sizeof(int32_t));
        request->blocks = colored_malloc((size_t)(block_capacity > 0 ? block_capacity : 1) * sizeof(int32_t));
        (*spacers)[k] = malloc(64 + (next_random() % 512));
        if (!request->tokens || !request->blocks || !(*spacers)[k]) goto fail;
        request->capacity = capacity;
        request->block_capacity = block_capacity;
        request->request_id = order[k];
    }
    free(order);
    return requests;
fail:
    free(order);
    free_requests(requests, requests ? count : 0, *spacers);
    *spacers = NULL;
    return NULL;
}

static void free_requests(FloorRequest **requests, Py_ssize_t count, void **spacers) {
    if (requests) {
        for (Py_ssize_t i = 0; i < count; i++) {
            if (requests[i]) {
                colored_free(requests[i]->tokens);
                colored_free(requests[i]->blocks);
                free(requests[i]);
            }
        }
    }
    if (spacers) {
        for (Py_ssize_t i = 0; i < count; i++) free(spacers[i]);
    }
    free(requests);
    free(spacers);
}

/* ------------------------------------------------------------------ executor */
typedef struct {
    int32_t *input_ids, *position_ids, *gather_ids, *seq_lens, *num_cached_tokens, *prompt_lens, *cu_seqlens;
    int64_t *request_ids;
    int32_t *draft_tokens, *draft_lens;
} PrepareOutputs;

/* prepare_inputs' rows: context chunks, generation with drafts, plain generation. */
static int64_t prepare_once(FloorRequest **context, Py_ssize_t num_context, FloorRequest **generation,
                            Py_ssize_t num_generation, const PrepareOutputs *out) {
    int64_t row = 0, seq = 0, gather = 0, draft = 0, drafted = 0;
    out->cu_seqlens[0] = 0;
    for (Py_ssize_t i = 0; i < num_context; i++) {
        const FloorRequest *r = context[i];
        int64_t p = r->context_position, c = r->chunk;
        memcpy(out->input_ids + row, r->tokens + p, (size_t)c * sizeof(int32_t));
        for (int64_t j = 0; j < c; j++) out->position_ids[row + j] = (int32_t)(p + j);
        out->gather_ids[gather++] = (int32_t)(row + c - 1);
        out->seq_lens[seq] = (int32_t)c;
        out->num_cached_tokens[seq] = (int32_t)p;
        out->prompt_lens[seq] = r->prompt_len;
        out->request_ids[seq] = r->request_id;
        row += c;
        out->cu_seqlens[++seq] = (int32_t)row;
    }
    for (int pass = 0; pass < 2; pass++) {  /* requests with drafts first, then plain ones */
        for (Py_ssize_t i = 0; i < num_generation; i++) {
            const FloorRequest *r = generation[i];
            int64_t k = r->num_drafts, n = r->num_tokens;
            if ((k > 0) != (pass == 0)) continue;
            out->input_ids[row] = r->tokens[n - 1];
            if (k) {
                memcpy(out->input_ids + row + 1, r->drafts, (size_t)k * sizeof(int32_t));
                memcpy(out->draft_tokens + draft, r->drafts, (size_t)k * sizeof(int32_t));
                draft += k;
                out->draft_lens[drafted++] = (int32_t)k;
            }
            for (int64_t j = 0; j <= k; j++) {
                out->position_ids[row + j] = (int32_t)(n - 1 + j);
                out->gather_ids[gather++] = (int32_t)(row + j);
            }
            out->seq_lens[seq] = (int32_t)(1 + k);
            out->num_cached_tokens[seq] = (int32_t)(n - 1);
            out->prompt_lens[seq] = r->prompt_len;
            out->request_ids[seq] = r->request_id;
            row += 1 + k;
            out->cu_seqlens[++seq] = (int32_t)row;
        }
    }
    return row;
}

static PyObject *round_list(const double *seconds, Py_ssize_t rounds) {
    PyObject *list = PyList_New(rounds);
    if (!list) return NULL;
    for (Py_ssize_t i = 0; i < rounds; i++) {
        PyObject *value = PyFloat_FromDouble(seconds[i]);
        if (!value) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, i, value);
    }
    return list;
}

FLOOR_INTERNAL PyObject *timed_result(const double *seconds, Py_ssize_t rounds, int64_t work) {
    PyObject *list = round_list(seconds, rounds);
    return list ? Py_BuildValue("(NL)", list, (long long)work) : NULL;
}

FLOOR_INTERNAL int check_sizes(Py_ssize_t a, Py_ssize_t b, Py_ssize_t c, Py_ssize_t reps, Py_ssize_t rounds) {
    if (a < 0 || b < 0 || c < 0 || reps < 1 || rounds < 1) {
        PyErr_SetString(PyExc_ValueError, "sizes must be >= 0 and reps, rounds >= 1");
        return -1;
    }
    if (a > INT32_MAX || b > INT32_MAX || c > INT32_MAX || (a && b > INT32_MAX / a)) {
        PyErr_SetString(PyExc_ValueError, "sizes too large: the batch must hold fewer than 2**31 tokens");
        return -1;
    }
    return 0;
}

typedef struct {
    FloorRequest **context;
    Py_ssize_t num_context;
    FloorRequest **generation;
    Py_ssize_t num_generation;
    const PrepareOutputs *out;
} PrepareCall;

static int64_t prepare_call(void *state) {
    const PrepareCall *call = state;
    return prepare_once(call->context, call->num_context, call->generation, call->num_generation, call->out);
}

PyDoc_STRVAR(prepare_doc,
"prepare(num_generation, seq_len, num_drafts, chunk, reps, rounds) -> (seconds per call per round, rows)\n\n"
"The rows prepare_inputs writes for one context chunk of `chunk` tokens at position\n"
"seq_len (none when chunk is 0) and num_generation generation requests of seq_len tokens\n"
"with num_drafts draft tokens each, in C, timed over `reps` calls per round. `rows`: the\n"
"token rows the timed calls wrote, all together (the work done, to check against tokcy).");

static PyObject *floor_prepare(PyObject *self, PyObject *args) {
    Py_ssize_t num_generation, seq_len, num_drafts, chunk, reps, rounds;
    if (!PyArg_ParseTuple(args, "nnnnnn", &num_generation, &seq_len, &num_drafts, &chunk, &reps, &rounds)) return NULL;
    if (check_sizes(num_generation, seq_len, chunk, reps, rounds) < 0) return NULL;
    if (num_drafts < 0 || num_drafts > 8 || seq_len < 1) {
        PyErr_SetString(PyExc_ValueError, "num_drafts must be in [0, 8] and seq_len >= 1");
        return NULL;
    }
    Py_ssize_t num_context = chunk > 0 ? 1 : 0;
    void **spacers = NULL, **context_spacers = NULL;
    FloorRequest **generation = make_requests(num_generation, seq_len, 0, &spacers);
    FloorRequest **context = make_requests(num_context, seq_len + chunk, 0, &context_spacers);
    int64_t rows = chunk + (1 + num_drafts) * num_generation, seqs = num_generation + num_context;
    PrepareOutputs out;
    /* input_ids starts 1,088 bytes into its block: with both blocks from malloc, the chunk
     * copy's source and destination could otherwise sit at the same offset modulo 4 KiB,
     * and that aliasing made the copy four times slower here: not a floor. */
    int32_t *input_ids_block = malloc((size_t)(rows + 1 + 272) * 4);
    out.input_ids = input_ids_block ? input_ids_block + 272 : NULL;
    out.position_ids = malloc((size_t)(rows + 1) * 4);
    out.gather_ids = malloc((size_t)(rows + 1) * 4);
    out.seq_lens = malloc((size_t)(seqs + 1) * 4);
    out.num_cached_tokens = malloc((size_t)(seqs + 1) * 4);
    out.prompt_lens = malloc((size_t)(seqs + 1) * 4);
    out.cu_seqlens = malloc((size_t)(seqs + 2) * 4);
    out.request_ids = malloc((size_t)(seqs + 1) * 8);
    out.draft_tokens = malloc((size_t)(seqs * num_drafts + 1) * 4);
    out.draft_lens = malloc((size_t)(seqs + 1) * 4);
    double *seconds = malloc((size_t)rounds * sizeof(double));
    PyObject *result = NULL;
    int64_t checksum = 0;
    if (!generation || !context || !out.input_ids || !out.position_ids || !out.gather_ids || !out.seq_lens ||
        !out.num_cached_tokens || !out.prompt_lens || !out.cu_seqlens || !out.request_ids || !out.draft_tokens ||
        !out.draft_lens || !seconds) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < num_generation; i++) {
        FloorRequest *r = generation[i];
        /* a decode row reads the newest token only: the others are left unwritten, so that a
         * round's set-up does not sweep the caches and TLB between two of tokcy's rounds
         * (256 x 512 KB at L = 131,072); their storage is allocated all the same */
        r->tokens[seq_len - 1] = (int32_t)(next_random() % 128000);
        r->num_tokens = seq_len;
        r->prompt_len = (int32_t)(seq_len - 1);
        r->num_drafts = num_drafts;
        for (int64_t j = 0; j < num_drafts; j++) r->drafts[j] = (int32_t)(i + j);
        r->request_id = 1 + i;
    }
    for (Py_ssize_t i = 0; i < num_context; i++) {
        FloorRequest *r = context[i];
        for (int64_t j = seq_len; j < seq_len + chunk; j++) r->tokens[j] = (int32_t)(next_random() % 128000);  /* the chunk */
        r->num_tokens = r->prompt_len = (int32_t)(seq_len + chunk);
        r->context_position = seq_len;
        r->chunk = chunk;
        r->request_id = 0;
    }
    PrepareCall call = {context, num_context, generation, num_generation, &out};
    Py_BEGIN_ALLOW_THREADS
    checksum = time_calls(prepare_call, &call, reps, rounds, seconds);
    Py_END_ALLOW_THREADS
    result = timed_result(seconds, rounds, checksum);
done:
    free_requests(generation, num_generation, spacers);
    free_requests(context, num_context, context_spacers);
    free(input_ids_block); free(out.position_ids); free(out.gather_ids); free(out.seq_lens);
    free(out.num_cached_tokens); free(out.prompt_lens); free(out.cu_seqlens); free(out.request_ids);
    free(out.draft_tokens); free(out.draft_lens); free(seconds);
    return result;
}

/* ------------------------------------------------------------------ connector */
typedef struct {
    int64_t *request_ids, *positions, *scheduled, *replaced_tokens, *token_offsets, *group_offsets, *block_offsets;
    int64_t *replaced_blocks, *released_blocks;
    unsigned char *is_new;
    int32_t *tokens, *block_ids;
} ReportOutputs;

/* build_scheduler_output's columns for generation rows (one layer group): the deltas. */
static int64_t report_once(FloorRequest **requests, FloorSlot *slots, Py_ssize_t count, const ReportOutputs *out) {
    int64_t token = 0, block = 0;
    out->token_offsets[0] = out->group_offsets[0] = out->block_offsets[0] = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        const FloorRequest *r = requests[i];
        FloorSlot *slot = &slots[i];
        int64_t n = r->num_tokens, new_tokens = n - slot->num_tokens, new_blocks = r->num_blocks - slot->num_blocks;
        out->request_ids[i] = r->request_id;
        out->is_new[i] = 0;
        out->positions[i] = n - 1;
        out->scheduled[i] = 1 + r->num_drafts;
        out->replaced_tokens[i] = 0;
        memcpy(out->tokens + token, r->tokens + slot->num_tokens, (size_t)new_tokens * sizeof(int32_t));
        token += new_tokens;
        out->token_offsets[i + 1] = token;
        memcpy(out->block_ids + block, r->blocks + slot->num_blocks, (size_t)new_blocks * sizeof(int32_t));
        block += new_blocks;
        out->block_offsets[i + 1] = block;
        out->group_offsets[i + 1] = i + 1;
        out->replaced_blocks[i] = 0;
        out->released_blocks[i] = 0;
        slot->num_tokens = n;
        slot->num_blocks = r->num_blocks;
    }
    return token + block;
}

PyDoc_STRVAR(report_doc,
"report(num_requests, num_tokens, block_size, reps, rounds) -> (seconds per call per round, entries)\n\n"
"The columnar report build_scheduler_output makes in steady decode (every request one\n"
"new token, a new block every block_size tokens), in C. Each repetition first appends\n"
"one token per request (untimed, as the benchmark's world does), then times the report.\n"
"`entries`: the tokens and block ids the timed reports copied, all together.");

static PyObject *floor_report(PyObject *self, PyObject *args) {
    Py_ssize_t count, num_tokens, block_size, reps, rounds;
    if (!PyArg_ParseTuple(args, "nnnnn", &count, &num_tokens, &block_size, &reps, &rounds)) return NULL;
    if (check_sizes(count, num_tokens, block_size, reps, rounds) < 0) return NULL;
    if (block_size < 1 || num_tokens < 1) {
        PyErr_SetString(PyExc_ValueError, "block_size and num_tokens must be >= 1");
        return NULL;
    }
    int64_t steps = (int64_t)reps * (rounds + 1) + 2, capacity = num_tokens + steps;
    int64_t block_capacity = capacity / block_size + 2;
    void **spacers = NULL;
    FloorRequest **requests = make_requests(count, capacity, block_capacity, &spacers);
    FloorSlot *slots = calloc((size_t)count + 1, sizeof(FloorSlot));
    ReportOutputs out;
    out.request_ids = malloc((size_t)(count + 1) * 8);
    out.positions = malloc((size_t)(count + 1) * 8);
    out.scheduled = malloc((size_t)(count + 1) * 8);
    out.replaced_tokens = malloc((size_t)(count + 1) * 8);
    out.token_offsets = malloc((size_t)(count + 2) * 8);
    out.group_offsets = malloc((size_t)(count + 2) * 8);
    out.block_offsets = malloc((size_t)(count + 2) * 8);
    out.replaced_blocks = malloc((size_t)(count + 1) * 8);
    out.released_blocks = malloc((size_t)(count + 1) * 8);
    out.is_new = malloc((size_t)(count + 1));
    out.tokens = malloc((size_t)(count + 1) * 4);
    out.block_ids = malloc((size_t)(count + 1) * 4);
    double *seconds = malloc((size_t)rounds * sizeof(double));
    int64_t checksum = 0, next_block = 0;
    PyObject *result = NULL;
    if (!requests || !slots || !out.request_ids || !out.positions || !out.scheduled || !out.replaced_tokens ||
        !out.token_offsets || !out.group_offsets || !out.block_offsets || !out.replaced_blocks ||
        !out.released_blocks || !out.is_new || !out.tokens || !out.block_ids || !seconds) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < count; i++) {  /* past the context report: everything reported */
        FloorRequest *r = requests[i];
        /* the report copies what comes after what was reported: the tokens and blocks held
         * now are never read, so they are left unwritten (as in prepare) */
        r->num_tokens = num_tokens;
        r->num_blocks = (num_tokens + block_size - 1) / block_size;
        next_block += r->num_blocks;
        slots[i].num_tokens = r->num_tokens;
        slots[i].num_blocks = r->num_blocks;
    }
    Py_BEGIN_ALLOW_THREADS
    double overhead = 1e9;  /* one clock_gettime pair, subtracted from each timed call */
    for (int k = 0; k < 64; k++) {
        double a = now(), b = now();
        if (b - a < overhead) overhead = b - a;
    }
    int64_t step = 0, warm = 0;
    for (Py_ssize_t round = -1; round < rounds; round++) {  /* round -1: warm-up */
        double total = 0.0;
        for (Py_ssize_t rep = 0; rep < reps; rep++) {
            step++;
            for (Py_ssize_t i = 0; i < count; i++) {  /* the untimed decode step */
                FloorRequest *r = requests[i];
                r->tokens[r->num_tokens++] = (int32_t)step;
                if (r->num_tokens % block_size == 1) r->blocks[r->num_blocks++] = (int32_t)next_block++;
            }
            double start = now();
            checksum += report_once(requests, slots, count, &out);
            __asm__ __volatile__("" ::: "memory");
            total += now() - start - overhead;
        }
        if (round >= 0) seconds[round] = total / (double)reps;
        else warm = checksum;  /* the warm-up's entries are not counted */
    }
    checksum -= warm;
    Py_END_ALLOW_THREADS
    result = timed_result(seconds, rounds, checksum);
done:
    free_requests(requests, count, spacers);
    free(slots);
    free(out.request_ids); free(out.positions); free(out.scheduled); free(out.replaced_tokens);
    free(out.token_offsets); free(out.group_offsets); free(out.block_offsets); free(out.replaced_blocks);
    free(out.released_blocks); free(out.is_new); free(out.tokens); free(out.block_ids); free(seconds);
    return result;
}

static PyMethodDef methods[] = {
    {"prepare", floor_prepare, METH_VARARGS, prepare_doc},
    {"report", floor_report, METH_VARARGS, report_doc},
    {"attention", floor_attention, METH_VARARGS, floor_attention_doc},
    {"attention_buffer", floor_attention_buffer, METH_VARARGS, floor_attention_buffer_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "tokcy.bench._floor",
    "The floor: tokcy's hot loops as plain C over C arrays, timed in C (a private benchmark helper).",
    -1, methods,
};

PyMODINIT_FUNC PyInit__floor(void) { return PyModule_Create(&module); }
