/* The layer tap's eval callback in C (layer_tap.py compiles it once against the installed ggml.h).
 * llama.cpp's scheduler calls it for every graph node of every decode; in Python that cost ~1 ms a token. */
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "ggml.h"
#include "ggml-backend.h"

/* Mirrored by layer_tap._NativeTapState. */
struct surprisegate_tap {
    char name[GGML_MAX_NAME]; /* the tensor to keep, e.g. "l_out-17" */
    int64_t width;            /* its row length (n_embd) */
    float *out;               /* width floats: the last position's row */
    int32_t fresh;            /* set once a decode has written out */
    int32_t paused;           /* nonzero: keep nothing, and split no graph */
};

bool surprisegate_tap_eval(struct ggml_tensor *t, bool ask, void *user_data) {
    struct surprisegate_tap *tap = (struct surprisegate_tap *)user_data;
    if (tap->paused || strncmp(t->name, tap->name, GGML_MAX_NAME) != 0) {
        return !ask; /* not wanted; once computed, go on */
    }
    if (ask) {
        return true;
    }
    const struct ggml_backend_buffer *buffer = t->view_src ? t->view_src->buffer : t->buffer;
    if (buffer != NULL && t->data != NULL && t->type == GGML_TYPE_F32 && t->ne[0] == tap->width && t->ne[1] > 0) {
        /* tensor_get reads host and device buffers alike */
        ggml_backend_tensor_get(t, tap->out, (size_t)(t->ne[1] - 1) * t->nb[1], (size_t)tap->width * sizeof(float));
        tap->fresh = 1;
    }
    return true;
}

size_t surprisegate_tap_name_size(void) { return GGML_MAX_NAME; }

/* Every position's row of several layers (a calibration keeps the states of the replies it labels).
 * Mirrored by layer_tap._NativeRowsState. */
#define SURPRISEGATE_ROWS_MAX_LAYERS 8

struct surprisegate_rows {
    char names[SURPRISEGATE_ROWS_MAX_LAYERS][GGML_MAX_NAME]; /* "l_out-13", ... */
    int32_t n_layers;
    int64_t width;                                           /* row length (n_embd) */
    int64_t capacity;                                        /* rows each buffer holds */
    float *out[SURPRISEGATE_ROWS_MAX_LAYERS];                /* capacity x width floats per layer */
    int64_t count[SURPRISEGATE_ROWS_MAX_LAYERS];             /* rows seen since the last clear (may pass capacity) */
    int32_t paused;                                          /* nonzero: keep nothing, and split no graph */
};

bool surprisegate_rows_eval(struct ggml_tensor *t, bool ask, void *user_data) {
    struct surprisegate_rows *rows = (struct surprisegate_rows *)user_data;
    if (rows->paused) {
        return !ask;
    }
    int32_t i = 0;
    while (i < rows->n_layers && strncmp(t->name, rows->names[i], GGML_MAX_NAME) != 0) {
        i++;
    }
    if (i == rows->n_layers) {
        return !ask;
    }
    if (ask) {
        return true;
    }
    const struct ggml_backend_buffer *buffer = t->view_src ? t->view_src->buffer : t->buffer;
    if (buffer != NULL && t->data != NULL && t->type == GGML_TYPE_F32 && t->ne[0] == rows->width &&
        t->nb[1] == (size_t)rows->width * sizeof(float)) {
        int64_t room = rows->capacity - rows->count[i];
        int64_t n = t->ne[1] < room ? t->ne[1] : room;
        if (n > 0) {
            ggml_backend_tensor_get(t, rows->out[i] + rows->count[i] * rows->width, 0,
                                    (size_t)(n * rows->width) * sizeof(float));
        }
        rows->count[i] += t->ne[1]; /* past capacity: the reader sees it overflowed */
    }
    return true;
}

int32_t surprisegate_rows_max_layers(void) { return SURPRISEGATE_ROWS_MAX_LAYERS; }
