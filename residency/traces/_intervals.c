/* The measure of a union of interval sets, in one pass over their rows.
 *
 * `union_length(sets, within)`: each set either a C-contiguous int64 buffer of its rows as
 * [start0, end0, start1, end1, ...] sorted by start (a normalised set of
 * residency.traces.intervals is), or a packed normalised set as residency.traces.intervals.pack
 * gives it, `(start0, end0, lengths, gaps)` (two ints, then two 1-D buffers of unsigned 8-,
 * 16-, 32- or 64-bit ints or int64: the lengths of rows 1.. and the gaps before them), decoded
 * row by row as it is read, never unpacked; `within` a C-contiguous int64 buffer of a
 * normalised set (at least one interval). Returns the measure in ns of the union of every row
 * intersected with `within`, as a Python int. The sets are merged by start through a binary
 * heap of one cursor per set (O(N log k) for N rows in k sets), with no copy of any row; each
 * group of the union is intersected with `within` as it closes, both in order. ValueError
 * where a set or `within` has another form. The caller owns the inputs' validity (sorted by
 * start, ends not before starts, packed values that do not overflow: `intervals.unpack`'s
 * checks); the answer for other rows is still a finite sum, never a read out of bounds.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define CHUNK 512 /* rows of a packed set decoded at a time */

typedef struct {
    const int64_t *rows;   /* the rows at hand: the set's own, or a decoded chunk */
    Py_ssize_t n, at;      /* rows at hand, the cursor's row among them */
    int64_t s, e;          /* the cursor's row */
    Py_ssize_t wi;         /* the first interval of `within` that may meet it */
    /* packed sets: the columns after the first row, their item sizes, rows decoded so far
     * (of `total`), the last end decoded, and the chunk they are decoded into */
    const char *len, *gap;
    int lsz, gsz;
    Py_ssize_t total, done;
    int64_t last_e;
    int64_t *buf;
} Cursor;

/* Copies `count` items of `size` bytes from `src` (from item `from`) into every other slot
 * of `dst`, as int64 (unsigned: pack's columns). */
static void spread(int64_t *dst, const char *src, int size, Py_ssize_t from, Py_ssize_t count) {
    switch (size) {
    case 1:
        for (Py_ssize_t i = 0; i < count; i++) dst[2 * i] = ((const uint8_t *)src)[from + i];
        break;
    case 2:
        for (Py_ssize_t i = 0; i < count; i++) dst[2 * i] = ((const uint16_t *)src)[from + i];
        break;
    case 4:
        for (Py_ssize_t i = 0; i < count; i++) dst[2 * i] = ((const uint32_t *)src)[from + i];
        break;
    default:
        for (Py_ssize_t i = 0; i < count; i++)
            dst[2 * i] = (int64_t)((const uint64_t *)src)[from + i];
    }
}

/* Decodes the next chunk of a packed cursor (rows 1.. of its set; row 0 is decoded when the
 * cursor is made): 0 where none is left. */
static int refill(Cursor *c) {
    if (!c->buf || c->done >= c->total) return 0;
    Py_ssize_t count = c->total - c->done;
    if (count > CHUNK) count = CHUNK;
    Py_ssize_t from = c->done - 1; /* (column item k is row k + 1's) */
    spread(c->buf, c->gap, c->gsz, from, count);
    spread(c->buf + 1, c->len, c->lsz, from, count);
    int64_t e = c->last_e;
    for (Py_ssize_t i = 0; i < count; i++) { /* (wraps where a hostile column overflows) */
        int64_t s = (int64_t)((uint64_t)e + (uint64_t)c->buf[2 * i]);
        e = (int64_t)((uint64_t)s + (uint64_t)c->buf[2 * i + 1]);
        c->buf[2 * i] = s;
        c->buf[2 * i + 1] = e;
    }
    c->last_e = e;
    c->done += count;
    c->rows = c->buf;
    c->n = count;
    c->at = 0;
    return 1;
}

/* Moves `c` to its next row, loaded: 0 where the set is done. */
static int advance(Cursor *c) {
    if (++c->at >= c->n && !refill(c)) return 0;
    c->s = c->rows[2 * c->at];
    c->e = c->rows[2 * c->at + 1];
    return 1;
}

static void sift_down(Cursor *cur, Py_ssize_t *heap, Py_ssize_t size, Py_ssize_t i) {
    for (;;) {
        Py_ssize_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < size && cur[heap[l]].s < cur[heap[m]].s) m = l;
        if (r < size && cur[heap[r]].s < cur[heap[m]].s) m = r;
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
        if (cur[heap[p]].s <= cur[heap[i]].s) return;
        Py_ssize_t t = heap[i];
        heap[i] = heap[p];
        heap[p] = t;
        i = p;
    }
}

/* The first row of unpacked `c` whose end is after `lo` (a binary search over the ends,
 * which ascend where the set is normalised; in bounds whatever their order). */
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

static int is_int_format(const Py_buffer *v, int any_unsigned) {
    const char *f = v->format;
    if (!f) return 0;
    if (*f == '<' || *f == '=' || *f == '@') f++;
    if (strlen(f) != 1) return 0;
    if (v->itemsize == 8 && (*f == 'q' || *f == 'l')) return 1;
    return any_unsigned && strchr("BHILQ", *f) && (v->itemsize == 1 || v->itemsize == 2 ||
                                                   v->itemsize == 4 || v->itemsize == 8);
}

/* Moves `c` (its current row loaded) to its first row, from that one on, that meets `w`
 * (none can meet any interval before c->wi): 1 where there is one, 0 where the set is done.
 * Rows that meet nothing of `w` add nothing to the measure, so they are passed over here,
 * never merged (markers: a few short intervals over a device-dense set). */
static int settle(Cursor *c, const int64_t *w, Py_ssize_t nw) {
    for (;;) {
        while (c->wi < nw && w[2 * c->wi + 1] <= c->s) c->wi++;
        if (c->wi == nw) return 0;
        if (c->e > w[2 * c->wi] && c->e > c->s) return 1;
        if (!advance(c)) return 0;
    }
}

/* The measure of [s, e) intersected with the normalised `w` (nw intervals), from interval
 * *at on; *at moves past the intervals that end at or before `s` (groups come in order). */
static int64_t clipped(int64_t s, int64_t e, const int64_t *w, Py_ssize_t nw, Py_ssize_t *at) {
    while (*at < nw && w[2 * *at + 1] <= s) (*at)++;
    int64_t total = 0;
    for (Py_ssize_t k = *at; k < nw && w[2 * k] < e; k++) {
        int64_t a = s > w[2 * k] ? s : w[2 * k], b = e < w[2 * k + 1] ? e : w[2 * k + 1];
        if (b > a) total += b - a;
    }
    return total;
}

/* The measure of the union of two settled cursors' rows inside the one interval [lo, hi):
 * their rows merged by a select, not a heap, and the groups tracked without a branch (two
 * ranks interleave row by row, so every branch on which comes next is a coin toss). */
static int64_t two_way(Cursor *a, Cursor *b, int64_t lo, int64_t hi) {
    int va = 1, vb = 1;
    int64_t total = 0, s0 = INT64_MIN, e0 = INT64_MIN;
    while (va || vb) {
        int pick = vb && (!va || b->s < a->s);
        Cursor *c = pick ? b : a;
        int64_t s = c->s < lo ? lo : c->s, e = c->e > hi ? hi : c->e;
        if (e > s) {
            int fresh = s > e0;
            total += fresh ? e0 - s0 : 0;
            s0 = fresh ? s : s0;
            e0 = (fresh || e > e0) ? e : e0;
        }
        int ok = advance(c) && c->s < hi;
        if (pick)
            vb = ok;
        else
            va = ok;
    }
    return total + (e0 - s0);
}

static PyObject *union_length(PyObject *module, PyObject *args) {
    PyObject *sets, *within_obj;
    if (!PyArg_ParseTuple(args, "OO:union_length", &sets, &within_obj)) return NULL;
    PyObject *seq = PySequence_Fast(sets, "union_length(sets, within): sets must be a sequence");
    if (!seq) return NULL;
    Py_ssize_t k = PySequence_Fast_GET_SIZE(seq), held = 0;
    /* per set up to two buffers (rows; or lengths and gaps), then `within` */
    Py_buffer *views = PyMem_Calloc(2 * k + 1, sizeof(Py_buffer));
    Cursor *cur = PyMem_Calloc(k ? k : 1, sizeof(Cursor));
    Py_ssize_t *heap = PyMem_Calloc(k ? k : 1, sizeof(Py_ssize_t));
    PyObject *out = NULL;
    const char *bad = "union_length: a set must be int64 rows or (start0, end0, lengths, gaps)";
    if (!views || !cur || !heap) {
        PyErr_NoMemory();
        goto done;
    }
    if (PyObject_GetBuffer(within_obj, &views[held], PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        goto done;
    Py_buffer *wv = &views[held++];
    if (!is_int_format(wv, 0) || wv->len % 16 || wv->len == 0) {
        PyErr_SetString(PyExc_ValueError, "union_length: within must be int64 rows, at least one");
        goto done;
    }
    for (Py_ssize_t i = 0; i < k; i++) {
        PyObject *item_obj = PySequence_Fast_GET_ITEM(seq, i);
        if (PyTuple_Check(item_obj)) {
            long long s0, e0;
            PyObject *lo, *go;
            if (!PyArg_ParseTuple(item_obj, "LLOO", &s0, &e0, &lo, &go)) goto done;
            if (PyObject_GetBuffer(lo, &views[held], PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
                goto done;
            Py_buffer *lv = &views[held++];
            if (PyObject_GetBuffer(go, &views[held], PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
                goto done;
            Py_buffer *gv = &views[held++];
            if (!is_int_format(lv, 1) || !is_int_format(gv, 1) ||
                lv->len / lv->itemsize != gv->len / gv->itemsize) {
                PyErr_SetString(PyExc_ValueError, bad);
                goto done;
            }
            Cursor *c = &cur[i];
            c->len = lv->buf, c->gap = gv->buf;
            c->lsz = (int)lv->itemsize, c->gsz = (int)gv->itemsize;
            c->total = lv->len / lv->itemsize + 1;
            c->buf = PyMem_Malloc(2 * CHUNK * sizeof(int64_t));
            if (!c->buf) {
                PyErr_NoMemory();
                goto done;
            }
            c->buf[0] = s0, c->buf[1] = e0; /* row 0, as a chunk of its own */
            c->rows = c->buf, c->n = 1, c->done = 1, c->last_e = e0;
        } else {
            if (PyObject_GetBuffer(item_obj, &views[held], PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
                goto done;
            Py_buffer *v = &views[held++];
            if (!is_int_format(v, 0) || v->len % 16) {
                PyErr_SetString(PyExc_ValueError, bad);
                goto done;
            }
            cur[i].rows = (const int64_t *)v->buf;
            cur[i].n = v->len / 16;
        }
    }
    const int64_t *w = (const int64_t *)wv->buf;
    Py_ssize_t nw = wv->len / 16;
    int64_t lo = w[0], total = 0;
    Py_BEGIN_ALLOW_THREADS
    Py_ssize_t size = 0, w_at = 0;
    for (Py_ssize_t i = 0; i < k; i++) {
        Cursor *c = &cur[i];
        c->at = c->buf ? 0 : first_after(c, lo); /* (packed: passed over by `settle`) */
        if (c->at >= c->n) continue;
        c->s = c->rows[2 * c->at];
        c->e = c->rows[2 * c->at + 1];
        if (settle(c, w, nw)) {
            heap[size] = i;
            sift_up(cur, heap, size++);
        }
    }
    int open = 0;
    int64_t s0 = 0, e0 = 0; /* the group open so far */
    if (size == 2 && nw == 1) {  /* (two sets, one interval: every settled row meets it) */
        total = two_way(&cur[heap[0]], &cur[heap[1]], w[0], w[1]);
        size = 0;
    }
    while (size > 0) {
        Cursor *c = &cur[heap[0]];
        int64_t s = c->s, e = c->e;
        if (advance(c) && settle(c, w, nw)) {
            sift_down(cur, heap, size, 0);
        } else {
            heap[0] = heap[--size];
            sift_down(cur, heap, size, 0);
        }
        if (!open) {
            s0 = s, e0 = e, open = 1;
        } else if (s > e0) {
            total += clipped(s0, e0, w, nw, &w_at);
            s0 = s, e0 = e;
        } else if (e > e0) {
            e0 = e;
        }
    }
    if (open) total += clipped(s0, e0, w, nw, &w_at);
    Py_END_ALLOW_THREADS
    out = PyLong_FromLongLong(total);
done:
    for (Py_ssize_t i = 0; cur && i < k; i++) PyMem_Free(cur[i].buf);
    for (Py_ssize_t i = 0; i < held; i++) PyBuffer_Release(&views[i]);
    PyMem_Free(views);
    PyMem_Free(cur);
    PyMem_Free(heap);
    Py_DECREF(seq);
    return out;
}

static PyMethodDef methods[] = {
    {"union_length", union_length, METH_VARARGS,
     "union_length(sets, within) -> int: the measure of the union of interval sets (int64 rows "
     "sorted by start, or packed) intersected with `within` (module doc)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT, "residency.traces._intervals",
    "The measure of a union of interval sets, merged by start in one pass.", -1, methods,
};

PyMODINIT_FUNC PyInit__intervals(void) { return PyModule_Create(&moduledef); }
