/* The measure of a union of interval sets, in one pass over their rows.
 *
 * `union_length(sets, lo, hi)`: `sets` a sequence of C-contiguous int64 buffers, each the rows
 * of one set as [start0, end0, start1, end1, ...] sorted by start (a normalised set of
 * residency.traces.intervals is); returns the measure in ns of the union of every row clipped
 * to [lo, hi), as a Python int. The sets are merged by start through a binary heap of one
 * cursor per set (O(N log k) for N rows in k sets), with no copy of any row; each set's first
 * row ending after `lo` is found by binary search. ValueError where a buffer is not int64
 * rows. The caller owns the inputs' validity (sorted by start, end >= start); the answer for
 * other rows is still a finite sum, never a read out of bounds.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

typedef struct {
    const int64_t *rows; /* 2 values a row */
    Py_ssize_t n, at;    /* rows, the cursor's row */
} Cursor;

static int64_t start_of(const Cursor *c) { return c->rows[2 * c->at]; }

static void sift_down(Cursor *cur, Py_ssize_t *heap, Py_ssize_t size, Py_ssize_t i) {
    for (;;) {
        Py_ssize_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < size && start_of(&cur[heap[l]]) < start_of(&cur[heap[m]])) m = l;
        if (r < size && start_of(&cur[heap[r]]) < start_of(&cur[heap[m]])) m = r;
        if (m == i) return;
        Py_ssize_t t = heap[i];
        heap[i] = heap[m];
        heap[m] = t;
        i = m;
    }
}

static void sift_up(Cursor *cur, Py_ssize_t *heap, Py_ssize_t i) {
    while (i > 0) {
        Py_ssize_t p = (i - 1) / 2;
        if (start_of(&cur[heap[p]]) <= start_of(&cur[heap[i]])) return;
        Py_ssize_t t = heap[i];
        heap[i] = heap[p];
        heap[p] = t;
        i = p;
    }
}

/* The first row of `c` whose end is after `lo` (ends ascend where the set is normalised; a
 * binary search over them, so any order ends in bounds). */
static Py_ssize_t first_after(const Cursor *c, int64_t lo) {
    Py_ssize_t a = 0, b = c->n;
    while (a < b) {
        Py_ssize_t mid = a + (b - a) / 2;
        if (c->rows[2 * mid + 1] <= lo)
            a = mid + 1;
        else
            b = mid;
    }
    return a;
}

static PyObject *union_length(PyObject *module, PyObject *args) {
    PyObject *sets;
    long long lo, hi;
    if (!PyArg_ParseTuple(args, "OLL:union_length", &sets, &lo, &hi)) return NULL;
    PyObject *seq = PySequence_Fast(sets, "union_length(sets, lo, hi): sets must be a sequence");
    if (!seq) return NULL;
    Py_ssize_t k = PySequence_Fast_GET_SIZE(seq), held = 0;
    Py_buffer *views = PyMem_Calloc(k ? k : 1, sizeof(Py_buffer));
    Cursor *cur = PyMem_Calloc(k ? k : 1, sizeof(Cursor));
    Py_ssize_t *heap = PyMem_Calloc(k ? k : 1, sizeof(Py_ssize_t));
    PyObject *out = NULL;
    if (!views || !cur || !heap) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < k; i++) {
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(seq, i), &views[i],
                               PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
            goto done;
        held++;
        const char *f = views[i].format;
        if (views[i].itemsize != 8 || views[i].len % 16 ||
            !(f && (strcmp(f, "q") == 0 || strcmp(f, "l") == 0 || strcmp(f, "<q") == 0 ||
                    strcmp(f, "=q") == 0 || strcmp(f, "<l") == 0 || strcmp(f, "=l") == 0))) {
            PyErr_SetString(PyExc_ValueError, "union_length: every set must be int64 rows");
            goto done;
        }
    }
    int64_t total = 0;
    Py_BEGIN_ALLOW_THREADS
    Py_ssize_t size = 0;
    for (Py_ssize_t i = 0; i < k; i++) {
        cur[i].rows = (const int64_t *)views[i].buf;
        cur[i].n = views[i].len / 16;
        cur[i].at = first_after(&cur[i], lo);
        if (cur[i].at < cur[i].n && start_of(&cur[i]) < hi) {
            heap[size] = i;
            sift_up(cur, heap, size++);
        }
    }
    int open = 0;
    int64_t s0 = 0, e0 = 0; /* the group open so far */
    while (size > 0) {
        Cursor *c = &cur[heap[0]];
        int64_t s = c->rows[2 * c->at], e = c->rows[2 * c->at + 1];
        c->at++;
        if (c->at < c->n && start_of(c) < hi) {
            sift_down(cur, heap, size, 0);
        } else {
            heap[0] = heap[--size];
            sift_down(cur, heap, size, 0);
        }
        if (s < lo) s = lo;
        if (e > hi) e = hi;
        if (e <= s) continue;
        if (!open) {
            s0 = s, e0 = e, open = 1;
        } else if (s > e0) {
            total += e0 - s0;
            s0 = s, e0 = e;
        } else if (e > e0) {
            e0 = e;
        }
    }
    if (open) total += e0 - s0;
    Py_END_ALLOW_THREADS
    out = PyLong_FromLongLong(total);
done:
    for (Py_ssize_t i = 0; i < held; i++) PyBuffer_Release(&views[i]);
    PyMem_Free(views);
    PyMem_Free(cur);
    PyMem_Free(heap);
    Py_DECREF(seq);
    return out;
}

static PyMethodDef methods[] = {
    {"union_length", union_length, METH_VARARGS,
     "union_length(sets, lo, hi) -> int: the measure of the union of interval sets, each int64 "
     "rows sorted by start, clipped to [lo, hi) (module doc)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT, "residency.traces._intervals",
    "The measure of a union of interval sets, merged by start in one pass.", -1, methods,
};

PyMODINIT_FUNC PyInit__intervals(void) { return PyModule_Create(&moduledef); }
