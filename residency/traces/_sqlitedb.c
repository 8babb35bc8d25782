/* Integer columns of one query of an untrusted SQLite file, read without a Python object a value.
 *
 * `int_columns(uri, sql, rules, max_rows, budget_s, max_value_bytes, max_sql_bytes)` opens
 * `uri` (a ``file:`` URI, read-only and immutable as residency.traces.sqlitedb builds it) with
 * the same guards as that module's connection: read-only, ``PRAGMA trusted_schema=OFF``, the
 * length limits (values, SQL text), no attached databases, and the query stopped once
 * `budget_s` seconds have passed (a progress handler). It runs `sql`, which must give one
 * column per letter of `rules`, each value taken by its column's rule (by SQLite's storage
 * class, as typeof() tells it): ``v`` an integer, else the read stops (status 1); ``i`` an
 * integer, else INT64_MIN; ``k`` an integer, NULL as INT64_MIN, else the read stops. Returns:
 *
 *   (0, [bytearray, ...])  one bytearray of native int64 per column;
 *   (1, None)              a value its rule refuses: the caller reads the table another way;
 *   (2, None)              more than `max_rows` rows;
 *   (3, (code, message))   SQLite's error (its primary result code and message), e.g.
 *                          SQLITE_INTERRUPT past the budget, SQLITE_TOOBIG past a length limit.
 *
 * Nothing in the file is executed beyond SQLite's reading of it; the connection is closed before
 * returning.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <sqlite3.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int past_deadline(void *deadline) {
    return now_s() > *(double *)deadline;
}

typedef struct {
    PyObject *array; /* a bytearray, grown by doubling; its size trimmed at the end */
    Py_ssize_t len, cap;
} Column;

static int column_push(Column *c, int64_t v) {
    if (c->len + (Py_ssize_t)sizeof v > c->cap) {
        Py_ssize_t cap = c->cap ? c->cap : (Py_ssize_t)(1 << 16);
        while (cap < c->len + (Py_ssize_t)sizeof v) {
            if (cap > PY_SSIZE_T_MAX / 2) {
                PyErr_NoMemory();
                return -1;
            }
            cap *= 2;
        }
        if (PyByteArray_Resize(c->array, cap) < 0)
            return -1;
        c->cap = cap;
    }
    memcpy(PyByteArray_AS_STRING(c->array) + c->len, &v, sizeof v);
    c->len += (Py_ssize_t)sizeof v;
    return 0;
}

static PyObject *sqlite_error(sqlite3 *db, int rc) {
    const char *msg = db ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
    return Py_BuildValue("(i(is))", 3, rc & 0xff, msg ? msg : "unknown error");
}

static PyObject *int_columns(PyObject *self, PyObject *args) {
    const char *uri, *sql, *rules;
    int width, max_value, max_sql;
    long long max_rows;
    double budget_s;
    (void)self;
    if (!PyArg_ParseTuple(args, "sssLdii", &uri, &sql, &rules, &max_rows, &budget_s,
                          &max_value, &max_sql))
        return NULL;
    width = (int)strlen(rules);
    if (width < 1 || width > 64 || strspn(rules, "vik") != (size_t)width) {
        PyErr_SetString(PyExc_ValueError, "rules must be 1 to 64 of the letters v, i, k");
        return NULL;
    }
    sqlite3 *db = NULL;
    sqlite3_stmt *stmt = NULL;
    PyObject *out = NULL;
    Column cols[64];
    memset(cols, 0, sizeof cols);
    double deadline = now_s() + budget_s;
    /* NOMUTEX: this connection lives and dies in this one call, on this one thread, so it
     * needs no lock of its own ("multi-thread" mode): ~20 % less CPU a row stepped */
    int rc = sqlite3_open_v2(uri, &db, SQLITE_OPEN_READONLY | SQLITE_OPEN_URI | SQLITE_OPEN_NOMUTEX,
                             NULL);
    if (rc != SQLITE_OK) {
        out = sqlite_error(db, rc);
        goto done;
    }
    sqlite3_limit(db, SQLITE_LIMIT_LENGTH, max_value);
    sqlite3_limit(db, SQLITE_LIMIT_SQL_LENGTH, max_sql);
    sqlite3_limit(db, SQLITE_LIMIT_ATTACHED, 0);
    rc = sqlite3_exec(db, "PRAGMA trusted_schema=OFF", NULL, NULL, NULL);
    if (rc != SQLITE_OK) {
        out = sqlite_error(db, rc);
        goto done;
    }
    sqlite3_progress_handler(db, 10000, past_deadline, &deadline);
    rc = sqlite3_prepare_v2(db, sql, -1, &stmt, NULL);
    if (rc != SQLITE_OK) {
        out = sqlite_error(db, rc);
        goto done;
    }
    if (sqlite3_column_count(stmt) != width) {
        PyErr_Format(PyExc_ValueError, "the query gives %d columns, not %d",
                     sqlite3_column_count(stmt), width);
        goto done;
    }
    for (int j = 0; j < width; j++) {
        cols[j].array = PyByteArray_FromStringAndSize(NULL, 0);
        if (!cols[j].array)
            goto done;
    }
    long long rows = 0;
    while ((rc = sqlite3_step(stmt)) == SQLITE_ROW) {
        if (++rows > max_rows) {
            out = Py_BuildValue("(iO)", 2, Py_None);
            goto done;
        }
        for (int j = 0; j < width; j++) {
            int type = sqlite3_column_type(stmt, j);
            int64_t v = INT64_MIN;
            if (type == SQLITE_INTEGER)
                v = (int64_t)sqlite3_column_int64(stmt, j);
            else if (rules[j] == 'v' || (rules[j] == 'k' && type != SQLITE_NULL)) {
                out = Py_BuildValue("(iO)", 1, Py_None);
                goto done;
            }
            if (column_push(&cols[j], v) < 0)
                goto done;
        }
    }
    if (rc != SQLITE_DONE) {
        out = sqlite_error(db, rc);
        goto done;
    }
    PyObject *list = PyList_New(width);
    if (!list)
        goto done;
    for (int j = 0; j < width; j++) {
        if (PyByteArray_Resize(cols[j].array, cols[j].len) < 0) {
            Py_DECREF(list);
            goto done;
        }
        PyList_SET_ITEM(list, j, cols[j].array);
        cols[j].array = NULL;
    }
    out = Py_BuildValue("(iN)", 0, list);
done:
    for (int j = 0; j < width; j++)
        Py_XDECREF(cols[j].array);
    if (stmt)
        sqlite3_finalize(stmt);
    if (db)
        sqlite3_close(db);
    return out;
}

static PyMethodDef methods[] = {
    {"int_columns", int_columns, METH_VARARGS,
     "int_columns(uri, sql, rules, max_rows, budget_s, max_value_bytes, max_sql_bytes) -> "
     "(status, payload): the int64 columns of one query (module doc)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT, "residency.traces._sqlitedb",
    "Integer columns of one query of an untrusted SQLite file.", -1, methods,
};

PyMODINIT_FUNC PyInit__sqlitedb(void) {
    return PyModule_Create(&moduledef);
}
