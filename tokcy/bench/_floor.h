/* What the floor's C files share (tokcy/bench/_floor.c and _floor_attention.c). */
#ifndef TOKCY_FLOOR_H
#define TOKCY_FLOOR_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* shared between the two files only: not exported from the extension */
#if defined(__GNUC__) || defined(__clang__)
#define FLOOR_INTERNAL __attribute__((visibility("hidden")))
#else
#define FLOOR_INTERNAL
#endif

FLOOR_INTERNAL double now(void);                    /* CLOCK_MONOTONIC, seconds */
FLOOR_INTERNAL uint64_t next_random(void);          /* xorshift: the batches' ids and allocation order */
FLOOR_INTERNAL Py_ssize_t *shuffled_order(Py_ssize_t count);  /* a random permutation of 0..count-1, or NULL */
/* A request's tokens or block ids: `bytes` from malloc, colored as tokcy's own buffers (a
 * large one starts a rotating number of cache lines in, new_storage() in _core_buffer.pxi),
 * so the floor pays no cache-set conflicts that tokcy avoids; NULL out of memory. Freed
 * with colored_free (NULL is fine). */
FLOOR_INTERNAL void *colored_malloc(size_t bytes);
FLOOR_INTERNAL void colored_free(void *memory);
/* ValueError unless each size is >= 0 (a, b, c) and >= 1 (reps, rounds), and a, b, c and
 * a * b stay under 2**31 (what the loops index and allocate) */
FLOOR_INTERNAL int check_sizes(Py_ssize_t a, Py_ssize_t b, Py_ssize_t c, Py_ssize_t reps, Py_ssize_t rounds);
FLOOR_INTERNAL PyObject *timed_result(const double *seconds, Py_ssize_t rounds, int64_t work);  /* (seconds, work) */

/* once(state) reps times a round after one warm-up call (run it without the GIL): seconds per
 * call per round into seconds[], and the sum of what the timed calls returned (their work).
 * Inline, so each loop calls its own step directly. */
static inline int64_t time_calls(int64_t (*once)(void *), void *state, Py_ssize_t reps, Py_ssize_t rounds,
                                 double *seconds) {
    int64_t total = 0;
    once(state);  /* warm-up, not counted */
    for (Py_ssize_t round = 0; round < rounds; round++) {
        double start = now();
        for (Py_ssize_t rep = 0; rep < reps; rep++) {
            total += once(state);
            __asm__ __volatile__("" ::: "memory");  /* every call writes its outputs */
        }
        seconds[round] = (now() - start) / (double)reps;
    }
    return total;
}

FLOOR_INTERNAL PyObject *floor_attention(PyObject *self, PyObject *args);
FLOOR_INTERNAL PyObject *floor_attention_buffer(PyObject *self, PyObject *args);
FLOOR_INTERNAL extern const char floor_attention_doc[];
FLOOR_INTERNAL extern const char floor_attention_buffer_doc[];

#endif
