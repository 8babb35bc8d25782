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

typedef struct {
    const int64_t *rows; /* unpacked: 2 values a row; NULL where packed */
    const char *len, *gap; /* packed: the columns after the first row */
    int lsz, gsz;          /* their item sizes */
    int64_t s0, e0;        /* packed: the first row */
    Py_ssize_t n, at;      /* rows, the cursor's row */
    int64_t s, e;          /* the cursor's row */
    Py_ssize_t wi;         /* the first interval of `within` that may meet it */
} Cursor;

static uint64_t item(const char *p, int size, Py_ssize_t i) {
    switch (size) {
    case 1: return ((const uint8_t *)p)[i];
    case 2: return ((const uint16_t *)p)[i];
    case 4: return ((const uint32_t *)p)[i];
    default: return ((const uint64_t *)p)[i];
    }
}

/* Loads row `at` (rows: read; packed: from the row before, already loaded). */
static void load(Cursor *c) {
    if (c->rows) {
        c->s = c->rows[2 * c->at];
        c->e = c->rows[2 * c->at + 1];
    } else if (c->at == 0) {
        c->s = c->s0;
        c->e = c->e0;
    } else {
        c->s = (int64_t)((uint64_t)c->e + item(c->gap, c->gsz, c->at - 1));
        c->e = (int64_t)((uint64_t)c->s + item(c->len, c->lsz, c->at - 1));
    }
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

/* Moves `c` to its first row, from its current one on, that meets `w` (none can meet any
 * interval before c->wi): 1 where there is one (loaded), 0 where the set is done. Rows that
 * meet nothing of `w` add nothing to the measure, so they are passed over here, decoded but
 * never merged (markers: a few short intervals over a device-dense set). */
static int settle(Cursor *c, const int64_t *w, Py_ssize_t nw) {
    while (c->at < c->n) {
        load(c);
        while (c->wi < nw && w[2 * c->wi + 1] <= c->s) c->wi++;
        if (c->wi == nw) return 0;
        if (c->e > w[2 * c->wi] && c->e > c->s) return 1;
        c->at++;
    }
    return 0;
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
        c->at++;
        int ok = c->at < c->n;
        if (ok) {
            load(c);
            ok = c->s < hi;
        }
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
            cur[i].len = lv->buf, cur[i].gap = gv->buf;
            cur[i].lsz = (int)lv->itemsize, cur[i].gsz = (int)gv->itemsize;
            cur[i].s0 = s0, cur[i].e0 = e0;
            cur[i].n = lv->len / lv->itemsize + 1;
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
        c->at = c->rows ? first_after(c, lo) : 0;  /* (packed: passed over by `settle`) */
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
        c->at++;
        if (settle(c, w, nw)) {
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
