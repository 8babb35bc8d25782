/* The columns a Kineto trace (and torch-npu's text export) gives analysis, read from one run of
 * its events in one pass.
 *
 * `scan(data, kind_of, names)`: `data` is the text of a JSON array of events (a run, as
 * residency.traces.jsonstream hands it over). The text is validated as strict JSON (RFC 8259,
 * strict UTF-8) while the top-level keys "ph", "cat", "name", "ts" and "dur" of each event
 * are picked out. Kept: the complete events (ph "X") whose category is a device task or a host
 * range (kind 1 or 2; `kind_of(raw)` classifies the raw JSON text of a category, once per
 * distinct text in the run).
 *
 * Returns None where the text is not handled here: not valid JSON, or valid but outside the
 * forms below (an escaped key or ph, a repeated key, a kept time as text or with an
 * exponent, a time beyond 9e15 us, nesting deeper than MAX_DEPTH, an element that is not an
 * object, more than MAX_CATS distinct categories, names colliding past MAX_PROBES, a kept
 * name that is neither a string nor null, a float that may pass DBL_MAX). The caller then
 * decodes the run with msgspec, which gives the same columns or the error.
 * Accepting only what msgspec accepts (never more) is what makes the two paths agree: this
 * reader is stricter where it is simpler.
 *
 * Else (events in the array, kinds int8, ts int64 ns, dur int64 ns, ok uint8, name_ids,
 * names), one entry per kept event in order. Times are nanoseconds from the decimal text
 * exactly (nearest, ties away from zero); ok is 0 where ts or dur is missing or not a number
 * (null, true, ...). With `names` (0: none, 1: host ranges', 2: every kept event's): those
 * events' name numbers (int32) and the JSON array of the distinct raw name values they
 * number ("" where missing); else b"" and None.
 *
 * `scan_ascend(data)`: the same for a run of torch-npu's text export (trace_view.json), what
 * residency.traces.ascend_text's AscendColumns keeps of it: per complete event with a pid (an
 * int or a string), in order, the pid's number among the run's distinct raw pids, ts and dur
 * as ns (ts as `units.us_to_ns` reads an int, a float or decimal text `-?d+(.d+)?`; dur exact
 * from its decimal text), ok (both times, |ts| and dur below 2**62 ns, dur >= 0), the raw
 * name's number, args["Task Type"]'s number (-1: none) among the run's distinct raw strings;
 * and each process_name metadata event's (raw pid, raw args). Returns (events, pid_ids, pids,
 * ts, dur, ok, name_ids, names, task_ids, tasks, metas), the tables as JSON arrays; or None
 * where msgspec decides: invalid JSON, an escaped or repeated key, an escaped ph, an element
 * that is not an object, time text of another form, an exponent, a float or long int pid,
 * nesting deeper than MAX_DEPTH, and a name that is no string where the msgspec path reads
 * the run with its any-type events (a float in a name is text there). Values its typed decode
 * rejects but its any-type path reads (a text dur, args null, an unknown phase, ...) are read
 * as that path reads them.
 *
 * The input is untrusted: every read is bounded by the buffer's end; nothing is executed.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define MAX_DEPTH 64
#define MAX_CATS 256
#define MAX_INT_US 9000000000000000LL /* 9e15 us: ns stay within int64 */

typedef const unsigned char *cp;

typedef struct {
    cp p, end;
} Reader;

typedef struct {
    char *data;
    Py_ssize_t len, cap;
} Buf;

static int buf_grow(Buf *b, Py_ssize_t extra) {
    if (b->len + extra <= b->cap)
        return 0;
    Py_ssize_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + extra) {
        if (cap > PY_SSIZE_T_MAX / 2)
            return -1;
        cap *= 2;
    }
    char *d = PyMem_Realloc(b->data, (size_t)cap);
    if (!d)
        return -1;
    b->data = d;
    b->cap = cap;
    return 0;
}

static int buf_put(Buf *b, const void *src, Py_ssize_t n) {
    if (buf_grow(b, n) < 0)
        return -1;
    memcpy(b->data + b->len, src, (size_t)n);
    b->len += n;
    return 0;
}

/* -- JSON syntax ------------------------------------------------------------------------- */

static inline void skip_ws(Reader *r) {
    cp p = r->p, end = r->end;
    while (p < end && *p <= ' ' && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t'))
        p++;
    r->p = p;
}

static inline int is_digit(unsigned char c) {
    return (unsigned char)(c - '0') < 10;
}

/* 1: a byte that ends the plain run inside a string (quote, backslash, control, non-ASCII) */
static unsigned char STOP[256];

static void init_tables(void) {
    for (int c = 0; c < 256; c++)
        STOP[c] = (c < 0x20 || c == '"' || c == '\\' || c >= 0x80);
}

#define ONES 0x0101010101010101ULL
#define HIGHS 0x8080808080808080ULL

/* The high bit of each byte of w (little-endian order) that is a quote, a backslash, below
 * 0x20 or at least 0x80; 0 when there is none. Each term's lowest set bit marks its first such
 * byte exactly (a borrow only reaches the bytes above one), so the lowest set bit of the whole
 * is the first stop byte. */
static inline uint64_t stops(uint64_t w) {
    uint64_t quote = w ^ (ONES * '"'), slash = w ^ (ONES * '\\');
    return (((quote - ONES) & ~quote) | ((slash - ONES) & ~slash) | ((w - ONES * 0x20) & ~w) |
            w) & HIGHS;
}

static inline int hexval(unsigned char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* One UTF-8 sequence starting at p (a byte >= 0x80): its length, or 0 if invalid (overlong,
 * surrogate, beyond U+10FFFF, truncated). */
static inline int utf8_len(cp p, cp end) {
    unsigned char c = p[0];
    if (c >= 0xC2 && c <= 0xDF) {
        return (end - p >= 2 && (p[1] & 0xC0) == 0x80) ? 2 : 0;
    }
    if (c >= 0xE0 && c <= 0xEF) {
        if (end - p < 3 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80)
            return 0;
        if (c == 0xE0 && p[1] < 0xA0) return 0;  /* overlong */
        if (c == 0xED && p[1] >= 0xA0) return 0; /* surrogate */
        return 3;
    }
    if (c >= 0xF0 && c <= 0xF4) {
        if (end - p < 4 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80 ||
            (p[3] & 0xC0) != 0x80)
            return 0;
        if (c == 0xF0 && p[1] < 0x90) return 0; /* overlong */
        if (c == 0xF4 && p[1] >= 0x90) return 0; /* beyond U+10FFFF */
        return 4;
    }
    return 0;
}

/* A string at r->p (the opening quote). On success r->p is past the closing quote and
 * *escaped tells whether it held a backslash. -1: invalid or not handled (an escaped
 * surrogate: msgspec decides those). */
static inline int read_string(Reader *r, int *escaped) {
    cp p = r->p + 1, end = r->end;
    int esc = 0;
    for (;;) {
        /* eight bytes at a time while none of them is a quote, a backslash, a control or a
         * non-ASCII byte (the common case: plain ASCII text) */
#if defined(__GNUC__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
        while (end - p >= 8) {
            uint64_t w, m;
            memcpy(&w, p, 8);
            if ((m = stops(w)) != 0) {
                p += __builtin_ctzll(m) >> 3;
                break;
            }
            p += 8;
        }
#endif
        while (p < end && !STOP[*p])
            p++;
        if (p >= end)
            return -1;
        unsigned char c = *p;
        if (c == '"') {
            r->p = p + 1;
            *escaped = esc;
            return 0;
        }
        if (c == '\\') {
            esc = 1;
            if (end - p < 2)
                return -1;
            unsigned char e = p[1];
            if (e == '"' || e == '\\' || e == '/' || e == 'b' || e == 'f' || e == 'n' ||
                e == 'r' || e == 't') {
                p += 2;
                continue;
            }
            if (e != 'u' || end - p < 6)
                return -1;
            int v = 0;
            for (int k = 2; k < 6; k++) {
                int h = hexval(p[k]);
                if (h < 0)
                    return -1;
                v = v * 16 + h;
            }
            if (v >= 0xD800 && v <= 0xDFFF)
                return -1;
            p += 6;
            continue;
        }
        if (c < 0x20)
            return -1;
        int n = utf8_len(p, end);
        if (!n)
            return -1;
        p += n;
    }
}

typedef struct {
    int neg, exponent, fraction;
    cp int_start, int_end, frac_start, frac_end;
} Number;

/* A number at r->p, by JSON's grammar; its parts in *num. -1: not a number. */
static inline int read_number(Reader *r, Number *num) {
    cp p = r->p, end = r->end;
    num->neg = num->exponent = num->fraction = 0;
    if (p < end && *p == '-') {
        num->neg = 1;
        p++;
    }
    if (p >= end)
        return -1;
    num->int_start = p;
    if (*p == '0') {
        p++;
    } else if (is_digit(*p)) {
        while (p < end && is_digit(*p))
            p++;
    } else {
        return -1;
    }
    num->int_end = p;
    num->frac_start = num->frac_end = p;
    if (p < end && *p == '.') {
        p++;
        num->frac_start = p;
        while (p < end && is_digit(*p))
            p++;
        if (p == num->frac_start)
            return -1;
        num->frac_end = p;
        num->fraction = 1;
    }
    long digits = (long)(num->int_end - num->int_start), magnitude = digits;
    if (p < end && (*p == 'e' || *p == 'E')) {
        p++;
        int eneg = 0;
        if (p < end && (*p == '+' || *p == '-'))
            eneg = *p++ == '-';
        cp d = p;
        long ev = 0;
        while (p < end && is_digit(*p)) {
            if (ev < 1000000)
                ev = ev * 10 + (*p - '0');
            p++;
        }
        if (p == d)
            return -1;
        num->exponent = 1;
        magnitude = eneg ? digits - ev : digits + ev;
    }
    /* a float that may pass DBL_MAX (1e400, 1.8e308): msgspec refuses it ("Number out of
     * range"), so its path decides (an integer of any length it reads as an int) */
    if ((num->fraction || num->exponent) && magnitude > 300)
        return -1;
    r->p = p;
    return 0;
}

static int skip_value(Reader *r, int depth);

static int skip_container(Reader *r, int depth, unsigned char close) {
    if (depth >= MAX_DEPTH)
        return -1;
    r->p++; /* the opening bracket */
    skip_ws(r);
    if (r->p < r->end && *r->p == close) {
        r->p++;
        return 0;
    }
    for (;;) {
        if (close == '}') {
            int esc;
            if (r->p >= r->end || *r->p != '"' || read_string(r, &esc) < 0)
                return -1;
            skip_ws(r);
            if (r->p >= r->end || *r->p != ':')
                return -1;
            r->p++;
            skip_ws(r);
        }
        if (skip_value(r, depth + 1) < 0)
            return -1;
        skip_ws(r);
        if (r->p >= r->end)
            return -1;
        if (*r->p == close) {
            r->p++;
            return 0;
        }
        if (*r->p != ',')
            return -1;
        r->p++;
        skip_ws(r);
    }
}

static int literal(Reader *r, const char *word, Py_ssize_t n) {
    if (r->end - r->p < n || memcmp(r->p, word, (size_t)n) != 0)
        return -1;
    r->p += n;
    return 0;
}

/* Any value at r->p (white space before it already skipped). */
static int skip_value(Reader *r, int depth) {
    if (r->p >= r->end)
        return -1;
    switch (*r->p) {
    case '{':
        return skip_container(r, depth, '}');
    case '[':
        return skip_container(r, depth, ']');
    case '"': {
        int esc;
        return read_string(r, &esc);
    }
    case 't':
        return literal(r, "true", 4);
    case 'f':
        return literal(r, "false", 5);
    case 'n':
        return literal(r, "null", 4);
    default: {
        Number num;
        return read_number(r, &num);
    }
    }
}

/* -- one event --------------------------------------------------------------------------- */

enum { T_MISSING = 0, T_NUMBER, T_OTHER };

typedef struct {
    int type; /* T_* */
    int64_t ns;
} Time;

/* The number's microseconds as ns: nearest, ties away from zero. -1: not handled here. */
static int number_ns(const Number *num, int64_t *out) {
    if (num->exponent)
        return -1;
    int64_t us = 0;
    for (cp d = num->int_start; d < num->int_end; d++) {
        us = us * 10 + (*d - '0');
        if (us > MAX_INT_US)
            return -1;
    }
    int64_t ns = us * 1000;
    cp f = num->frac_start;
    Py_ssize_t nf = num->frac_end - f;
    int64_t scale = 100;
    for (Py_ssize_t k = 0; k < 3; k++, scale /= 10)
        if (k < nf)
            ns += (int64_t)(f[k] - '0') * scale;
    if (nf > 3 && f[3] >= '5') /* the fourth fraction digit decides: ties away from zero */
        ns += 1;
    *out = num->neg ? -ns : ns;
    return 0;
}

/* A time value at r->p: a number (converted), or another value (skipped: not a time). A
 * string as time: -1 (msgspec's path parses decimal text). */
static int read_time(Reader *r, int depth, Time *t, int *is_text) {
    if (r->p < r->end && (*r->p == '-' || (*r->p >= '0' && *r->p <= '9'))) {
        Number num;
        if (read_number(r, &num) < 0)
            return -1;
        t->type = T_NUMBER;
        if (number_ns(&num, &t->ns) < 0)
            return -1;
        return 0;
    }
    if (r->p < r->end && *r->p == '"')
        *is_text = 1;
    t->type = T_OTHER;
    return skip_value(r, depth);
}

typedef struct {
    cp start;
    Py_ssize_t len;
    int kind;
} Cat;

typedef struct {
    cp start; /* NULL: an empty slot */
    Py_ssize_t len;
    uint64_t hash;
    int32_t id;
} Name;

#define MAX_PROBES 64 /* a longer probe (crafted collisions): the run goes msgspec's way */

static inline uint64_t name_hash(cp p, Py_ssize_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ULL ^ (uint64_t)n;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = (h ^ w) * 0xFF51AFD7ED558CCDULL;
        h ^= h >> 32;
        p += 8;
        n -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, p, (size_t)n);
    h = (h ^ w) * 0xC4CEB9FE1A85EC53ULL;
    return h ^ (h >> 29);
}

/* Distinct raw JSON values of a run, numbered in order of first appearance; `text` is the JSON
 * array of them (opened by "[", closed by the caller). */
typedef struct {
    Name *slots; /* open addressing, `mask + 1` slots */
    Py_ssize_t mask, distinct;
    Buf text;
} Table;

typedef struct {
    PyObject *kind_of;
    Cat cats[MAX_CATS];
    int ncats;
    Buf kinds, ts, dur, ok;
    int want_names;
    Buf name_ids; /* int32 per named event: its name's number among the distinct ones */
    Table names;  /* the distinct raw names */
    int failed; /* a Python error is set */
} Scan;

/* The kind of a category's raw text: from the run's table, else asked of kind_of. -1: not
 * handled (too many distinct) or an error (s->failed). */
static int cat_kind(Scan *s, cp start, Py_ssize_t len) {
    for (int i = 0; i < s->ncats; i++)
        if (s->cats[i].len == len && memcmp(s->cats[i].start, start, (size_t)len) == 0)
            return s->cats[i].kind;
    if (s->ncats >= MAX_CATS)
        return -1;
    PyObject *raw = PyBytes_FromStringAndSize((const char *)start, len);
    if (!raw) {
        s->failed = 1;
        return -1;
    }
    PyObject *got = PyObject_CallOneArg(s->kind_of, raw);
    Py_DECREF(raw);
    if (!got) {
        s->failed = 1;
        return -1;
    }
    long kind = PyLong_AsLong(got);
    Py_DECREF(got);
    if (kind == -1 && PyErr_Occurred()) {
        s->failed = 1;
        return -1;
    }
    if (kind < 0 || kind > 2) {
        PyErr_SetString(PyExc_ValueError, "kind_of must return 0, 1 or 2");
        s->failed = 1;
        return -1;
    }
    s->cats[s->ncats].start = start;
    s->cats[s->ncats].len = len;
    s->cats[s->ncats].kind = (int)kind;
    s->ncats++;
    return (int)kind;
}

enum { K_OTHER, K_PH, K_CAT, K_NAME, K_TS, K_DUR };

static inline int key_of(cp k, Py_ssize_t n) {
    switch (n) {
    case 2:
        return k[0] == 'p' && k[1] == 'h' ? K_PH : k[0] == 't' && k[1] == 's' ? K_TS : K_OTHER;
    case 3:
        return memcmp(k, "cat", 3) == 0 ? K_CAT : memcmp(k, "dur", 3) == 0 ? K_DUR : K_OTHER;
    case 4:
        return memcmp(k, "name", 4) == 0 ? K_NAME : K_OTHER;
    default:
        return K_OTHER;
    }
}

static int table_grow(Table *s) {
    Py_ssize_t cap = s->slots ? (s->mask + 1) * 2 : 1024;
    Name *t = PyMem_Calloc((size_t)cap, sizeof(Name));
    if (!t)
        return -1;
    for (Py_ssize_t i = 0; s->slots && i <= s->mask; i++) {
        Name *e = &s->slots[i];
        if (!e->start)
            continue;
        Py_ssize_t j = (Py_ssize_t)(e->hash & (uint64_t)(cap - 1));
        while (t[j].start)
            j = (j + 1) & (cap - 1);
        t[j] = *e;
    }
    PyMem_Free(s->slots);
    s->slots = t;
    s->mask = cap - 1;
    return 0;
}

/* The number of the raw value `start[:len]` among the table's distinct values (a new one is
 * appended to its text). -2: no memory (a Python error is set); -1: too many collisions. */
static int32_t table_id(Table *s, cp start, Py_ssize_t len) {
    if (!s->slots || (s->distinct + 1) * 2 > s->mask + 1) {
        if (table_grow(s) < 0) {
            PyErr_NoMemory();
            return -2;
        }
    }
    uint64_t h = name_hash(start, len);
    Py_ssize_t j = (Py_ssize_t)(h & (uint64_t)s->mask);
    for (int probe = 0; probe < MAX_PROBES; probe++, j = (j + 1) & s->mask) {
        Name *e = &s->slots[j];
        if (!e->start) {
            if (s->distinct >= INT32_MAX ||
                (s->distinct && buf_put(&s->text, ",", 1) < 0) ||
                buf_put(&s->text, start, len) < 0) {
                PyErr_NoMemory();
                return -2;
            }
            e->start = start;
            e->len = len;
            e->hash = h;
            e->id = (int32_t)s->distinct++;
            return e->id;
        }
        if (e->hash == h && e->len == len && memcmp(e->start, start, (size_t)len) == 0)
            return e->id;
    }
    return -1;
}

static void table_free(Table *t) {
    PyMem_Free(t->slots);
    PyMem_Free(t->text.data);
}

/* The raw name's number in the run (table_id). -2: no memory (s->failed). */
static int32_t name_id(Scan *s, cp start, Py_ssize_t len) {
    int32_t id = table_id(&s->names, start, len);
    if (id == -2)
        s->failed = 1;
    return id;
}

static const unsigned char EMPTY_NAME[] = "\"\"";

/* One event object at r->p. -1: not handled (or s->failed). */
static int read_event(Reader *r, Scan *s) {
    cp cat = NULL, name = NULL;
    Py_ssize_t cat_len = 0, name_len = 0;
    int seen_ph = 0, seen_cat = 0, seen_name = 0, is_x = 0, cat_is_str = 0;
    int ts_text = 0, dur_text = 0;
    Time ts = {T_MISSING, 0}, dur = {T_MISSING, 0};
    Time *times[2] = {&ts, &dur};
    int seen_time[2] = {0, 0};
    int *texts[2] = {&ts_text, &dur_text};

    if (r->p >= r->end || *r->p != '{')
        return -1;
    r->p++;
    skip_ws(r);
    if (r->p < r->end && *r->p == '}') {
        r->p++;
        return 0; /* {}: no ph, not a complete event */
    }
    for (;;) {
        if (r->p >= r->end || *r->p != '"')
            return -1;
        cp k = r->p + 1;
        int esc;
        if (read_string(r, &esc) < 0)
            return -1;
        Py_ssize_t klen = (r->p - 1) - k;
        skip_ws(r);
        if (r->p >= r->end || *r->p != ':')
            return -1;
        r->p++;
        skip_ws(r);
        if (esc)
            return -1; /* an escaped key may name a field: msgspec decodes it */
        int key = key_of(k, klen);
        if (key == K_PH) {
            if (seen_ph++)
                return -1;
            if (r->p < r->end && *r->p == '"') {
                cp v = r->p;
                int vesc;
                if (read_string(r, &vesc) < 0 || vesc)
                    return -1;
                is_x = (r->p - v == 3 && v[1] == 'X');
            } else if (skip_value(r, 1) < 0) {
                return -1;
            }
        } else if (key == K_CAT) {
            if (seen_cat++)
                return -1;
            cat = r->p;
            if (r->p < r->end && *r->p == '"') {
                int vesc;
                if (read_string(r, &vesc) < 0)
                    return -1;
                cat_is_str = 1;
            } else if (skip_value(r, 1) < 0) {
                return -1;
            }
            cat_len = r->p - cat;
        } else if (key == K_NAME) {
            if (seen_name++)
                return -1;
            name = r->p;
            if (skip_value(r, 1) < 0)
                return -1;
            name_len = r->p - name;
        } else if (key == K_TS || key == K_DUR) {
            int j = key == K_DUR;
            if (seen_time[j]++)
                return -1;
            if (read_time(r, 1, times[j], texts[j]) < 0)
                return -1;
        } else if (skip_value(r, 1) < 0) {
            return -1;
        }
        skip_ws(r);
        if (r->p >= r->end)
            return -1;
        if (*r->p == '}') {
            r->p++;
            break;
        }
        if (*r->p != ',')
            return -1;
        r->p++;
        skip_ws(r);
    }
    if (!is_x || !cat_is_str)
        return 0;
    int kind = cat_kind(s, cat, cat_len);
    if (kind < 0)
        return -1;
    if (kind == 0)
        return 0;
    if (ts_text || dur_text)
        return -1; /* decimal text: msgspec's path */
    int8_t k8 = (int8_t)kind;
    uint8_t ok = ts.type == T_NUMBER && dur.type == T_NUMBER;
    int64_t tns = ok ? ts.ns : 0, dns = ok ? dur.ns : 0;
    if (buf_put(&s->kinds, &k8, 1) < 0 || buf_put(&s->ts, &tns, 8) < 0 ||
        buf_put(&s->dur, &dns, 8) < 0 || buf_put(&s->ok, &ok, 1) < 0) {
        PyErr_NoMemory();
        s->failed = 1;
        return -1;
    }
    if (s->want_names == 2 || (s->want_names == 1 && kind == 2)) {
        /* a kept name that is neither a string nor null: msgspec's path (it reads a number's
         * decimal text as it is written, "1.50", and refuses 1e400 as a trace error) */
        if (name && *name != '"' && *name != 'n')
            return -1;
        int32_t id = name ? name_id(s, name, name_len) : name_id(s, EMPTY_NAME, 2);
        if (id < 0)
            return -1;
        if (buf_put(&s->name_ids, &id, 4) < 0) {
            PyErr_NoMemory();
            s->failed = 1;
            return -1;
        }
    }
    return 0;
}

/* -- torch-npu's text export (`scan_ascend`) --------------------------------------------- */

/* A value as the ascend reader classifies it. */
enum { V_MISSING = 0, V_STRING, V_NUMBER, V_NULL, V_OBJECT, V_OTHER };

typedef struct {
    cp start, end;
    int type, esc;
    Number num;
} Val;

static int read_val(Reader *r, int depth, Val *v) {
    if (r->p >= r->end)
        return -1;
    v->start = r->p;
    unsigned char c = *r->p;
    if (c == '"') {
        v->type = V_STRING;
        if (read_string(r, &v->esc) < 0)
            return -1;
    } else if (c == '-' || is_digit(c)) {
        v->type = V_NUMBER;
        if (read_number(r, &v->num) < 0)
            return -1;
    } else if (c == 'n') {
        v->type = V_NULL;
        if (literal(r, "null", 4) < 0)
            return -1;
    } else {
        v->type = c == '{' ? V_OBJECT : V_OTHER;
        if (skip_value(r, depth) < 0)
            return -1;
    }
    v->end = r->p;
    return 0;
}

/* An args object at r->p (its "{"), an event's member: its "Task Type" in *task; *odd set
 * where a key is escaped or "Task Type" repeats (msgspec decides those). */
static int read_args(Reader *r, Val *task, int *odd) {
    r->p++;
    skip_ws(r);
    if (r->p < r->end && *r->p == '}') {
        r->p++;
        return 0;
    }
    for (;;) {
        if (r->p >= r->end || *r->p != '"')
            return -1;
        cp k = r->p + 1;
        int esc;
        if (read_string(r, &esc) < 0)
            return -1;
        Py_ssize_t klen = (r->p - 1) - k;
        skip_ws(r);
        if (r->p >= r->end || *r->p != ':')
            return -1;
        r->p++;
        skip_ws(r);
        if (esc)
            *odd = 1;
        if (!esc && klen == 9 && memcmp(k, "Task Type", 9) == 0) {
            if (task->type != V_MISSING)
                *odd = 1;
            if (read_val(r, 2, task) < 0)
                return -1;
        } else if (skip_value(r, 2) < 0) {
            return -1;
        }
        skip_ws(r);
        if (r->p >= r->end)
            return -1;
        if (*r->p == '}') {
            r->p++;
            return 0;
        }
        if (*r->p != ',')
            return -1;
        r->p++;
        skip_ws(r);
    }
}

typedef struct {
    Buf pid, ts, dur, ok, name_ids, task_ids;
    Table pids, names, tasks;
    PyObject *metas; /* list of (raw pid, raw args) of the process_name events */
} AScan;

#define INT64_US_OK 9223372036854775LL /* |us| below 2**63 // 1000: an int time's ns fit */
#define LIMIT_NS (1LL << 62)

/* A pid as msgspec's paths read it. 1: an int (at most 18 digits) or a string; 0: missing or
 * null; 2: true, false, an array or an object (no pid on the any-type path, which reads the
 * run where the typed one rejects it); -1: not handled (a float is text on the any-type path;
 * a long int). */
static int pid_kind(const Val *v) {
    if (v->type == V_MISSING || v->type == V_NULL)
        return 0;
    if (v->type == V_STRING)
        return 1;
    if (v->type == V_NUMBER)
        return !v->num.fraction && !v->num.exponent && v->num.int_end - v->num.int_start <= 18
                   ? 1 : -1;
    return 2;
}

static int64_t int_value(const Number *num) {
    int64_t v = 0;
    for (cp d = num->int_start; d < num->int_end; d++)
        v = v * 10 + (*d - '0');
    return num->neg ? -v : v;
}

/* Decimal text `-?d+(.d+)?` (between p and end) to ns: nearest, ties away from zero. -1:
 * another form, or beyond 9e15 us. */
static int text_ns(cp p, cp end, int64_t *out) {
    int neg = p < end && *p == '-';
    p += neg;
    cp d = p;
    int64_t us = 0;
    while (p < end && is_digit(*p)) {
        us = us * 10 + (*p++ - '0');
        if (us > MAX_INT_US)
            return -1;
    }
    if (p == d)
        return -1;
    int64_t ns = us * 1000;
    if (p < end) {
        if (*p != '.')
            return -1;
        cp f = ++p;
        while (p < end && is_digit(*p))
            p++;
        if (p == f || p != end)
            return -1;
        Py_ssize_t nf = p - f;
        int64_t scale = 100;
        for (Py_ssize_t k = 0; k < 3; k++, scale /= 10)
            if (k < nf)
                ns += (int64_t)(f[k] - '0') * scale;
        if (nf > 3 && f[3] >= '5')
            ns += 1;
    }
    *out = neg ? -ns : ns;
    return 0;
}

static int put_id(Buf *b, int32_t id) {
    return buf_put(b, &id, 4);
}

/* A time of an event as `_keep` reads it on either msgspec path: *ns and *ok (computed where
 * `kept`). `is_dur`: a number is exact decimal ns (floats_to_ns agrees wherever the typed path
 * keeps it, exact_floats); a float ts is its text on the any-type path: decimal ns too; an int
 * ts is _ints_to_ns's. Null or any other type: not a time. -1: not handled. */
static int time_ns(const Val *v, int is_dur, int kept, int64_t *ns, int *ok) {
    *ns = 0;
    *ok = 0;
    switch (v->type) {
    case V_MISSING:
        return 0;
    case V_NULL:
        return 0;
    case V_STRING:
        if (!kept)
            return 0;
        if (v->esc || text_ns(v->start + 1, v->end - 1, ns) < 0)
            return -1; /* Decimal decides every other text */
        *ok = 1;
        return 0;
    case V_NUMBER:
        if (v->num.exponent)
            return -1;
        if (!is_dur && !v->num.fraction) { /* an int: _ints_to_ns */
            if (v->num.int_end - v->num.int_start > 18)
                return -1;
            int64_t us = int_value(&v->num);
            *ok = us < INT64_US_OK && us > -INT64_US_OK;
            *ns = *ok ? us * 1000 : 0;
            return 0;
        }
        if (number_ns(&v->num, ns) < 0)
            return -1; /* beyond 9e15 us */
        *ok = 1;
        return 0;
    default:
        return 0;
    }
}

/* A complete event (ph "X"), kept if it has a pid. -1: not handled; -2: an error is set. */
static int ascend_x(AScan *s, Val *pid, Val *ts, Val *dur, Val *name, Val *args, Val *task,
                    int odd_args) {
    int has_pid = pid_kind(pid);
    if (has_pid < 0)
        return -1;
    int kept = has_pid == 1;
    int64_t dns, tns;
    int dok, tok;
    if (time_ns(ts, 0, kept, &tns, &tok) < 0 || time_ns(dur, 1, kept, &dns, &dok) < 0)
        return -1;
    if (args->type == V_OBJECT) {
        if (odd_args)
            return -1; /* an escaped or repeated key: msgspec decides */
    } /* args null or no object, a Task Type no string: none (the any-type path) */
    if (!kept)
        return 0;
    if (name->type != V_MISSING && name->type != V_NULL && name->type != V_STRING)
        return -1; /* msgspec's paths read such a name each its own way (a float as its repr
                    * or its text, 1e400 an error only where the name is used) */
    uint8_t ok = tok && dok && tns < LIMIT_NS && tns > -LIMIT_NS && dns >= 0 && dns < LIMIT_NS;
    int32_t pid_id = table_id(&s->pids, pid->start, pid->end - pid->start);
    if (pid_id < 0)
        return pid_id;
    int32_t name_id_ = name->type != V_STRING ? table_id(&s->names, EMPTY_NAME, 2) /* "" */
                                               : table_id(&s->names, name->start,
                                                           name->end - name->start);
    if (name_id_ < 0)
        return name_id_;
    int32_t task_id = -1;
    if (args->type == V_OBJECT && task->type == V_STRING) {
        task_id = table_id(&s->tasks, task->start, task->end - task->start);
        if (task_id < 0)
            return task_id;
    }
    if (put_id(&s->pid, pid_id) < 0 || buf_put(&s->ts, &tns, 8) < 0 ||
        buf_put(&s->dur, &dns, 8) < 0 || buf_put(&s->ok, &ok, 1) < 0 ||
        put_id(&s->name_ids, name_id_) < 0 || put_id(&s->task_ids, task_id) < 0) {
        PyErr_NoMemory();
        return -2;
    }
    return 0;
}

/* A metadata event (ph "M"): a process_name's (raw pid, raw args) kept. */
static int ascend_m(AScan *s, Val *pid, Val *name, Val *args) {
    int kind = pid_kind(pid);
    if (kind < 0)
        return -1;
    if (name->type == V_MISSING)
        return 0;
    if (name->type != V_STRING) {
        return 0; /* no str: the any-type path reads it as no process_name */
    }
    if (name->esc)
        return -1;
    if (!(name->end - name->start == 14 && memcmp(name->start + 1, "process_name", 12) == 0))
        return 0;
    PyObject *p = pid->type == V_MISSING
                      ? PyBytes_FromStringAndSize("null", 4)
                      : PyBytes_FromStringAndSize((const char *)pid->start, pid->end - pid->start);
    PyObject *a = args->type == V_MISSING
                      ? PyBytes_FromStringAndSize("", 0)
                      : PyBytes_FromStringAndSize((const char *)args->start,
                                                  args->end - args->start);
    PyObject *t = p && a ? PyTuple_Pack(2, p, a) : NULL;
    Py_XDECREF(p);
    Py_XDECREF(a);
    if (!t || PyList_Append(s->metas, t) < 0) {
        Py_XDECREF(t);
        return -2;
    }
    Py_DECREF(t);
    return 0;
}

enum { A_OTHER, A_PH, A_PID, A_TS, A_DUR, A_NAME, A_ARGS };

static inline int ascend_key(cp k, Py_ssize_t n) {
    switch (n) {
    case 2:
        return k[0] == 'p' && k[1] == 'h' ? A_PH : k[0] == 't' && k[1] == 's' ? A_TS : A_OTHER;
    case 3:
        return memcmp(k, "pid", 3) == 0 ? A_PID : memcmp(k, "dur", 3) == 0 ? A_DUR : A_OTHER;
    case 4:
        return memcmp(k, "name", 4) == 0 ? A_NAME : memcmp(k, "args", 4) == 0 ? A_ARGS : A_OTHER;
    default:
        return A_OTHER;
    }
}

/* One event object at r->p. -1: not handled; -2: an error is set. */
static int read_ascend_event(Reader *r, AScan *s) {
    Val v[7], task; /* v: by key (A_*; v[A_OTHER] unused); task: args["Task Type"] */
    memset(v, 0, sizeof v);
    memset(&task, 0, sizeof task);
    int odd_args = 0;
    if (r->p >= r->end || *r->p != '{')
        return -1;
    r->p++;
    skip_ws(r);
    if (r->p < r->end && *r->p == '}')
        return -1; /* no ph: msgspec decides */
    for (;;) {
        if (r->p >= r->end || *r->p != '"')
            return -1;
        cp k = r->p + 1;
        int esc;
        if (read_string(r, &esc) < 0)
            return -1;
        Py_ssize_t klen = (r->p - 1) - k;
        skip_ws(r);
        if (r->p >= r->end || *r->p != ':')
            return -1;
        r->p++;
        skip_ws(r);
        if (esc)
            return -1; /* an escaped key may name a field: msgspec decodes it */
        int key = ascend_key(k, klen);
        if (key == A_OTHER) {
            if (skip_value(r, 1) < 0)
                return -1;
        } else {
            Val *val = &v[key];
            if (val->type != V_MISSING)
                return -1; /* a repeated key */
            if (key == A_ARGS && r->p < r->end && *r->p == '{') {
                val->start = r->p;
                val->type = V_OBJECT;
                if (read_args(r, &task, &odd_args) < 0)
                    return -1;
                val->end = r->p;
            } else if (read_val(r, 1, val) < 0) {
                return -1;
            }
        }
        skip_ws(r);
        if (r->p >= r->end)
            return -1;
        if (*r->p == '}') {
            r->p++;
            break;
        }
        if (*r->p != ',')
            return -1;
        r->p++;
        skip_ws(r);
    }
    Val *ph = &v[A_PH];
    if (ph->type == V_STRING && ph->esc)
        return -1; /* an escaped ph may read "X" */
    if (ph->type != V_STRING || ph->end - ph->start != 3)
        return 0; /* no phase of the typed path: the any-type path ignores the event */
    unsigned char c = ph->start[1];
    if (c == 'X')
        return ascend_x(s, &v[A_PID], &v[A_TS], &v[A_DUR], &v[A_NAME], &v[A_ARGS], &task,
                        odd_args);
    if (c == 'M')
        return ascend_m(s, &v[A_PID], &v[A_NAME], &v[A_ARGS]);
    return 0; /* another phase (or an unknown one): its fields are ignored on both paths */
}

static void ascan_free(AScan *s) {
    PyMem_Free(s->pid.data);
    PyMem_Free(s->ts.data);
    PyMem_Free(s->dur.data);
    PyMem_Free(s->ok.data);
    PyMem_Free(s->name_ids.data);
    PyMem_Free(s->task_ids.data);
    table_free(&s->pids);
    table_free(&s->names);
    table_free(&s->tasks);
    Py_XDECREF(s->metas);
}

/* -- one run: a JSON array of events ---------------------------------------------------- */

/* The text at r read as one JSON array (and nothing after it), `read` taking each element in
 * turn with `state` (it returns < 0 where the run is not handled here, -2 where memory ran
 * out); whether it was read whole; the elements read in *n, the last `read` result in *got. */
static int read_array(Reader *r, int (*read)(Reader *, void *), void *state, Py_ssize_t *n,
                      int *got) {
    int handled = 0;
    skip_ws(r);
    if (r->p < r->end && *r->p == '[') {
        r->p++;
        skip_ws(r);
        if (r->p < r->end && *r->p == ']') {
            r->p++;
            handled = 1;
        } else {
            for (;;) {
                if ((*got = read(r, state)) < 0)
                    break;
                (*n)++;
                skip_ws(r);
                if (r->p >= r->end)
                    break;
                if (*r->p == ']') {
                    r->p++;
                    handled = 1;
                    break;
                }
                if (*r->p != ',')
                    break;
                r->p++;
                skip_ws(r);
            }
        }
        skip_ws(r);
        if (r->p != r->end)
            handled = 0; /* trailing text: msgspec reports where the array ends */
    }
    return handled;
}

static int read_ascend_element(Reader *r, void *s) { return read_ascend_event(r, (AScan *)s); }

static int read_kineto_element(Reader *r, void *s) { return read_event(r, (Scan *)s); }

#define DATA_OR_EMPTY(b) ((b).data ? (b).data : ""), (b).len

static PyObject *scan_ascend(PyObject *module, PyObject *args) {
    Py_buffer view;
    if (!PyArg_ParseTuple(args, "y*:scan_ascend", &view))
        return NULL;
    AScan s;
    memset(&s, 0, sizeof s);
    s.metas = PyList_New(0);
    if (!s.metas || buf_put(&s.pids.text, "[", 1) < 0 || buf_put(&s.names.text, "[", 1) < 0 ||
        buf_put(&s.tasks.text, "[", 1) < 0) {
        PyBuffer_Release(&view);
        ascan_free(&s);
        return s.metas ? PyErr_NoMemory() : NULL;
    }
    Reader r = {(cp)view.buf, (cp)view.buf + view.len};
    Py_ssize_t n = 0;
    int got = 0;
    int handled = read_array(&r, read_ascend_element, &s, &n, &got);
    PyBuffer_Release(&view);
    if (got == -2) {
        ascan_free(&s);
        return NULL;
    }
    if (!handled) {
        ascan_free(&s);
        Py_RETURN_NONE;
    }
    if (buf_put(&s.pids.text, "]", 1) < 0 || buf_put(&s.names.text, "]", 1) < 0 ||
        buf_put(&s.tasks.text, "]", 1) < 0) {
        ascan_free(&s);
        return PyErr_NoMemory();
    }
    PyObject *out = Py_BuildValue(
        "(ny#y#y#y#y#y#y#y#y#O)", n, DATA_OR_EMPTY(s.pid), DATA_OR_EMPTY(s.pids.text),
        DATA_OR_EMPTY(s.ts), DATA_OR_EMPTY(s.dur), DATA_OR_EMPTY(s.ok),
        DATA_OR_EMPTY(s.name_ids), DATA_OR_EMPTY(s.names.text), DATA_OR_EMPTY(s.task_ids),
        DATA_OR_EMPTY(s.tasks.text), s.metas);
    ascan_free(&s);
    return out;
}

/* -- the module -------------------------------------------------------------------------- */

static void scan_free(Scan *s) {
    PyMem_Free(s->kinds.data);
    PyMem_Free(s->ts.data);
    PyMem_Free(s->dur.data);
    PyMem_Free(s->ok.data);
    PyMem_Free(s->name_ids.data);
    table_free(&s->names);
}

static PyObject *scan(PyObject *module, PyObject *args) {
    Py_buffer view;
    PyObject *kind_of;
    int want_names;
    if (!PyArg_ParseTuple(args, "y*Oi:scan", &view, &kind_of, &want_names))
        return NULL;
    if (!PyCallable_Check(kind_of) || want_names < 0 || want_names > 2) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_TypeError, "scan(data, kind_of: callable, names: 0, 1 or 2)");
        return NULL;
    }
    Scan s;
    memset(&s, 0, sizeof s);
    s.kind_of = kind_of;
    s.want_names = want_names;
    if (buf_put(&s.names.text, "[", 1) < 0) {
        PyBuffer_Release(&view);
        return PyErr_NoMemory();
    }
    Reader r = {(cp)view.buf, (cp)view.buf + view.len};
    Py_ssize_t n = 0;
    int got = 0;
    int handled = read_array(&r, read_kineto_element, &s, &n, &got);
    PyBuffer_Release(&view);
    if (s.failed) {
        scan_free(&s);
        return NULL;
    }
    if (!handled) {
        scan_free(&s);
        Py_RETURN_NONE;
    }
    PyObject *names = Py_None;
    Py_INCREF(Py_None);
    if (want_names) {
        if (buf_put(&s.names.text, "]", 1) < 0) {
            scan_free(&s);
            Py_DECREF(Py_None);
            return PyErr_NoMemory();
        }
        Py_DECREF(Py_None);
        names = PyBytes_FromStringAndSize(s.names.text.data, s.names.text.len);
    }
    PyObject *out = NULL;
    if (names)
        out = Py_BuildValue("(ny#y#y#y#y#N)", n, s.kinds.data ? s.kinds.data : "", s.kinds.len,
                            s.ts.data ? s.ts.data : "", s.ts.len, s.dur.data ? s.dur.data : "",
                            s.dur.len, s.ok.data ? s.ok.data : "", s.ok.len,
                            s.name_ids.data ? s.name_ids.data : "", s.name_ids.len, names);
    scan_free(&s);
    return out;
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_VARARGS,
     "scan(data, kind_of, names) -> (n, kinds, ts, dur, ok, name_ids, names) | None: the kept columns "
     "of a run of Kineto events (module doc)."},
    {"scan_ascend", scan_ascend, METH_VARARGS,
     "scan_ascend(data) -> (n, pid_ids, pids, ts, dur, ok, name_ids, names, task_ids, tasks, "
     "metas) | None: the kept columns of a run of torch-npu trace_view.json events (module "
     "doc)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT, "residency.traces._kineto_scan",
    "One-pass strict reader of the columns of a run of Kineto (or torch-npu text) events.", -1,
    methods,
};

PyMODINIT_FUNC PyInit__kineto_scan(void) {
    init_tables();
    return PyModule_Create(&moduledef);
}
