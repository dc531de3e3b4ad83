/* The request path's spans in C: made, and written as OTLP `Span` fields.

   `new_span` makes an open `_lean.LeanSpan` (its slots filled, `__init__`
   not run); `span_fields` writes a list of ended ones (a request's, when its
   turn finishes) into one bytes object, reading their slots directly, and
   hands back the spans it does not write; `traceparent` formats a span's
   W3C header. `configure(LeanSpan, getrandbits)` tells it where the slots
   are. `span_field` writes one span from its parts (`_encode.encode_span`,
   for the spans the list call leaves: a trace state, which it writes).

   What the encoders leave to the Python one: events, links or a status
   (the control plane's spans and errors), a value of a kind they do not
   write (a mapping, a nested sequence, an int past 64 bits, a string that
   is not valid UTF-8, None, any other object); the Python encoder then
   writes the span (and raises for what OTLP cannot carry). The bytes are
   the Python encoder's (tests/unit/gateway/telemetry/test_spanwire.py).
   Built as an optional extension: without a compiler the Python code does
   all of it. Field numbers as in `_encode.py`. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>
#include <structmember.h>
#include <time.h>

typedef struct {
    unsigned char *p;
    Py_ssize_t len, cap;
    unsigned char small[1024];
} Buf;

static int buf_reserve(Buf *b, Py_ssize_t extra) {
    if (b->len + extra <= b->cap) return 0;
    Py_ssize_t cap = b->cap * 2;
    while (cap < b->len + extra) cap *= 2;
    unsigned char *p;
    if (b->p == b->small) {
        p = PyMem_Malloc(cap);
        if (p != NULL) memcpy(p, b->small, b->len);
    } else {
        p = PyMem_Realloc(b->p, cap);
    }
    if (p == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    b->p = p;
    b->cap = cap;
    return 0;
}

static void buf_free(Buf *b) {
    if (b->p != b->small) PyMem_Free(b->p);
}

static int varint_len(uint64_t n) {
    int k = 1;
    while (n >= 0x80) {
        n >>= 7;
        k++;
    }
    return k;
}

/* Callers reserve the room first. */
static void put_varint(Buf *b, uint64_t n) {
    while (n >= 0x80) {
        b->p[b->len++] = (unsigned char)((n & 0x7F) | 0x80);
        n >>= 7;
    }
    b->p[b->len++] = (unsigned char)n;
}

static void put_bytes(Buf *b, const void *s, Py_ssize_t n) {
    memcpy(b->p + b->len, s, n);
    b->len += n;
}

static void put_be64(Buf *b, uint64_t v) {
    for (int i = 7; i >= 0; i--) b->p[b->len++] = (unsigned char)(v >> (8 * i));
}

static void put_le64(Buf *b, uint64_t v) {
    for (int i = 0; i < 8; i++) b->p[b->len++] = (unsigned char)(v >> (8 * i));
}

/* A scalar's AnyValue body: 1 written, 0 not a scalar it writes (no error set), -1 error. */
static int scalar_size(PyObject *v, Py_ssize_t *size, const char **utf8, uint64_t *bits) {
    if (PyBool_Check(v)) {
        *size = 2;
        *bits = (v == Py_True);
        return 1;
    }
    if (PyLong_Check(v)) {
        int overflow = 0;
        long long n = PyLong_AsLongLongAndOverflow(v, &overflow);
        if (n == -1 && PyErr_Occurred()) return -1;
        if (overflow) return 0;
        *bits = (uint64_t)n;
        *size = 1 + varint_len(*bits);
        return 1;
    }
    if (PyFloat_Check(v)) {
        double d = PyFloat_AS_DOUBLE(v);
        memcpy(bits, &d, 8);
        *size = 9;
        return 1;
    }
    if (PyUnicode_Check(v)) {
        Py_ssize_t n;
        const char *s = PyUnicode_AsUTF8AndSize(v, &n);
        if (s == NULL) {
            PyErr_Clear(); /* not valid UTF-8: the Python encoder raises it */
            return 0;
        }
        *utf8 = s;
        *bits = (uint64_t)n;
        *size = 1 + varint_len((uint64_t)n) + n;
        return 1;
    }
    return 0;
}

static void put_scalar(Buf *b, PyObject *v, const char *utf8, uint64_t bits) {
    if (PyBool_Check(v)) {
        b->p[b->len++] = 0x10;
        b->p[b->len++] = (unsigned char)bits;
    } else if (PyLong_Check(v)) {
        b->p[b->len++] = 0x18;
        put_varint(b, bits);
    } else if (PyFloat_Check(v)) {
        b->p[b->len++] = 0x21;
        put_le64(b, bits);
    } else {
        b->p[b->len++] = 0x0A;
        put_varint(b, bits);
        put_bytes(b, utf8, (Py_ssize_t)bits);
    }
}

/* A KeyValue field (tag 9) up to its AnyValue's bytes (`any_len` of them, which the
   caller writes next), with the room for them reserved. */
static int put_key_value_head(Buf *b, const char *k, Py_ssize_t klen, Py_ssize_t any_len) {
    Py_ssize_t kv_len = 1 + varint_len((uint64_t)klen) + klen + 1 + varint_len((uint64_t)any_len) + any_len;
    if (buf_reserve(b, 1 + varint_len((uint64_t)kv_len) + kv_len) < 0) return -1;
    b->p[b->len++] = 0x4A;
    put_varint(b, (uint64_t)kv_len);
    b->p[b->len++] = 0x0A; /* KeyValue.key */
    put_varint(b, (uint64_t)klen);
    put_bytes(b, k, klen);
    b->p[b->len++] = 0x12; /* KeyValue.value */
    put_varint(b, (uint64_t)any_len);
    return 0;
}

/* One attribute's KeyValue field (tag 9): 1 written, 0 not written (no error), -1 error. */
static int put_attribute(Buf *b, PyObject *key, PyObject *value) {
    if (!PyUnicode_Check(key)) return 0;
    Py_ssize_t klen;
    const char *k = PyUnicode_AsUTF8AndSize(key, &klen);
    if (k == NULL) {
        PyErr_Clear();
        return 0;
    }
    Py_ssize_t any_len; /* the AnyValue message's length */
    const char *utf8 = NULL;
    uint64_t bits = 0;
    int array = PyTuple_CheckExact(value) || PyList_CheckExact(value);
    if (array) {
        Py_ssize_t n = PySequence_Fast_GET_SIZE(value), inner = 0;
        PyObject **items = PySequence_Fast_ITEMS(value);
        for (Py_ssize_t i = 0; i < n; i++) {
            Py_ssize_t size;
            int r = scalar_size(items[i], &size, &utf8, &bits);
            if (r <= 0) return r;
            inner += 1 + varint_len((uint64_t)size) + size;
        }
        /* AnyValue.array_value (field 5) holding ArrayValue.values (field 1) */
        any_len = 1 + varint_len((uint64_t)inner) + inner;
        if (put_key_value_head(b, k, klen, any_len) < 0) return -1;
        b->p[b->len++] = 0x2A;
        put_varint(b, (uint64_t)inner);
        for (Py_ssize_t i = 0; i < n; i++) {
            Py_ssize_t size;
            scalar_size(items[i], &size, &utf8, &bits); /* succeeded above */
            b->p[b->len++] = 0x0A;
            put_varint(b, (uint64_t)size);
            put_scalar(b, items[i], utf8, bits);
        }
        return 1;
    }
    int r = scalar_size(value, &any_len, &utf8, &bits);
    if (r <= 0) return r;
    if (put_key_value_head(b, k, klen, any_len) < 0) return -1;
    put_scalar(b, value, utf8, bits);
    return 1;
}

/* A span's parts, as `put_field` writes them: the name and kind either as one finished
   `head` (its name and kind fields) or as `name` and `kind`; `state` and `tail` finished fields. */
typedef struct {
    unsigned char trace_id[16]; /* big-endian */
    uint64_t span_id, parent_id, start, end;
    const char *head, *name, *state;
    Py_ssize_t head_len, name_len, state_len, tail_len;
    uint64_t kind;
    const unsigned char *tail;
    PyObject *attributes; /* a dict */
} Parts;

/* One span's whole Span field (its tag, length and body) appended to `b`: 1 written, 0 left
   to the Python encoder (`b` as it was), -1 error. The body goes after room for the tag and
   the longest length varint and is moved back once its length is known. */
static int put_field(Buf *b, const Parts *s) {
    Py_ssize_t at = b->len;
    if (buf_reserve(b, 96 + s->head_len + s->name_len + s->state_len) < 0) return -1;
    b->len += 11;
    Py_ssize_t body = b->len;
    b->p[b->len++] = 0x0A; /* trace_id */
    b->p[b->len++] = 16;
    put_bytes(b, s->trace_id, 16);
    b->p[b->len++] = 0x12; /* span_id */
    b->p[b->len++] = 8;
    put_be64(b, s->span_id);
    if (s->parent_id) {
        b->p[b->len++] = 0x22; /* parent_span_id */
        b->p[b->len++] = 8;
        put_be64(b, s->parent_id);
    }
    if (s->head != NULL) {
        put_bytes(b, s->head, s->head_len);
    } else {
        b->p[b->len++] = 0x2A; /* name */
        put_varint(b, (uint64_t)s->name_len);
        put_bytes(b, s->name, s->name_len);
        b->p[b->len++] = 0x30; /* kind: OTLP counts from UNSPECIFIED = 0 */
        b->p[b->len++] = (unsigned char)(s->kind + 1);
    }
    b->p[b->len++] = 0x39; /* start_time_unix_nano, fixed64 */
    put_le64(b, s->start);
    b->p[b->len++] = 0x41; /* end_time_unix_nano */
    put_le64(b, s->end);
    put_bytes(b, s->state, s->state_len); /* trace_state: its whole field, or nothing */
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    while (PyDict_Next(s->attributes, &pos, &key, &value)) {
        int r = put_attribute(b, key, value);
        if (r <= 0) {
            b->len = at;
            return r;
        }
    }
    if (buf_reserve(b, s->tail_len) < 0) return -1;
    put_bytes(b, s->tail, s->tail_len);
    Py_ssize_t size = b->len - body;
    unsigned char head[11];
    int h = 0;
    head[h++] = 0x12; /* ScopeSpans.spans, field 2 */
    for (uint64_t left = (uint64_t)size;; left >>= 7) {
        if (left < 0x80) {
            head[h++] = (unsigned char)left;
            break;
        }
        head[h++] = (unsigned char)((left & 0x7F) | 0x80);
    }
    memmove(b->p + at + h, b->p + body, size);
    memcpy(b->p + at, head, h);
    b->len = at + h + size;
    return 1;
}

static void buf_init(Buf *b) {
    b->p = b->small;
    b->len = 0;
    b->cap = (Py_ssize_t)sizeof(b->small);
}

static PyObject *span_field(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    /* (trace_hi, trace_lo, span_id, parent_id, head: bytes, start, end, state: bytes,
        attributes: dict, tail: bytes) */
    if (nargs != 10 || !PyBytes_Check(args[4]) || !PyBytes_Check(args[7]) || !PyDict_Check(args[8]) ||
        !PyBytes_Check(args[9])) {
        PyErr_SetString(PyExc_TypeError,
                        "span_field(trace_hi, trace_lo, span_id, parent_id, head, start, end, state, attributes, tail)");
        return NULL;
    }
    uint64_t ids[4], times[2];
    for (int i = 0; i < 4; i++) {
        ids[i] = PyLong_AsUnsignedLongLong(args[i]);
        if (ids[i] == (uint64_t)-1 && PyErr_Occurred()) return NULL;
    }
    for (int i = 0; i < 2; i++) {
        times[i] = PyLong_AsUnsignedLongLong(args[5 + i]);
        if (times[i] == (uint64_t)-1 && PyErr_Occurred()) return NULL;
    }
    Parts s = {.span_id = ids[2], .parent_id = ids[3], .start = times[0], .end = times[1]};
    for (int i = 0; i < 8; i++) {
        s.trace_id[i] = (unsigned char)(ids[0] >> (56 - 8 * i));
        s.trace_id[8 + i] = (unsigned char)(ids[1] >> (56 - 8 * i));
    }
    s.head = PyBytes_AS_STRING(args[4]);
    s.head_len = PyBytes_GET_SIZE(args[4]);
    s.state = PyBytes_AS_STRING(args[7]);
    s.state_len = PyBytes_GET_SIZE(args[7]);
    s.attributes = args[8];
    s.tail = (const unsigned char *)PyBytes_AS_STRING(args[9]);
    s.tail_len = PyBytes_GET_SIZE(args[9]);
    Buf b;
    buf_init(&b);
    int r = put_field(&b, &s);
    PyObject *out = r > 0 ? PyBytes_FromStringAndSize((const char *)b.p, b.len) : NULL;
    buf_free(&b);
    if (r == 0) Py_RETURN_NONE;
    return out;
}

/* -- whole spans, read from their slots -------------------------------------------

   `configure(LeanSpan)` finds where each slot of `_lean.LeanSpan` lives in
   its instances (the offsets its member descriptors hold); `span_fields`
   then reads ended spans of exactly that class without an attribute lookup
   and writes each common one (no events, links, status nor trace state,
   every value one it writes) as its Span field, all into one bytes object:
   the fields of a ScopeSpans message's spans, back to back. */

enum { S_NAME, S_TRACE, S_SPAN, S_PARENT, S_REMOTE, S_STATE, S_KIND, S_ATTRS, S_START, S_END, S_STATUS, S_LINKS,
       S_EVENTS, S_PUT, S_COUNT };
static const char *slot_names[S_COUNT] = {"name",       "trace_id", "span_id",    "parent_id", "parent_remote",
                                          "trace_state", "kind",    "attributes", "start_time", "end_time",
                                          "status",     "links",    "events",     "_put"};
static Py_ssize_t slot_offset[S_COUNT];
static PyTypeObject *span_type = NULL; /* the class `configure` was given (a strong reference) */
static PyObject *getrandbits = NULL;   /* random.getrandbits: span ids as the Python class draws them */
static PyObject *bits64 = NULL, *empty = NULL, *zero = NULL;

static PyObject *configure(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    /* (cls, getrandbits) */
    if (nargs != 2 || !PyType_Check(args[0]) || !PyCallable_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "configure(cls, getrandbits): a class with the span's slots");
        return NULL;
    }
    PyObject *cls = args[0];
    if (bits64 == NULL && (bits64 = PyLong_FromLong(64)) == NULL) return NULL;
    if (zero == NULL && (zero = PyLong_FromLong(0)) == NULL) return NULL;
    if (empty == NULL && (empty = PyTuple_New(0)) == NULL) return NULL;
    Py_ssize_t found[S_COUNT];
    for (int i = 0; i < S_COUNT; i++) {
        PyObject *d = PyObject_GetAttrString(cls, slot_names[i]);
        if (d == NULL) return NULL;
        int member = Py_IS_TYPE(d, &PyMemberDescr_Type) &&
                     ((PyMemberDescrObject *)d)->d_member->type == T_OBJECT_EX;
        if (member) found[i] = ((PyMemberDescrObject *)d)->d_member->offset;
        Py_DECREF(d);
        if (!member) {
            PyErr_Format(PyExc_TypeError, "%s is not a slot of %R", slot_names[i], cls);
            return NULL;
        }
    }
    memcpy(slot_offset, found, sizeof(found));
    Py_INCREF(cls);
    Py_XSETREF(span_type, (PyTypeObject *)cls);
    Py_INCREF(args[1]);
    Py_XSETREF(getrandbits, args[1]);
    Py_RETURN_NONE;
}

#define SLOT(obj, i) (*(PyObject **)((char *)(obj) + slot_offset[i]))

static PyObject *new_span(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    /* (put, name, trace_id, parent_id, kind, attributes, start_time | None, trace_state | None): an
       open span of the configured class, as its __init__ makes one (a new span id; now, for a
       start_time of None), without running it. */
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError,
                        "new_span(put, name, trace_id, parent_id, kind, attributes, start_time, trace_state)");
        return NULL;
    }
    if (span_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "new_span before configure(LeanSpan)");
        return NULL;
    }
    PyObject *start = args[6];
    if (start == Py_None) {
        struct timespec ts;
        if (clock_gettime(CLOCK_REALTIME, &ts) != 0) return PyErr_SetFromErrno(PyExc_OSError);
        start = PyLong_FromUnsignedLongLong((unsigned long long)ts.tv_sec * 1000000000ULL + ts.tv_nsec);
    } else {
        Py_INCREF(start);
    }
    if (start == NULL) return NULL;
    PyObject *span_id = PyObject_CallOneArg(getrandbits, bits64);
    if (span_id == NULL) {
        Py_DECREF(start);
        return NULL;
    }
    if (!PyObject_IsTrue(span_id)) { /* 0 is no span id */
        Py_SETREF(span_id, PyLong_FromLong(1));
        if (span_id == NULL) {
            Py_DECREF(start);
            return NULL;
        }
    }
    PyObject *span = span_type->tp_alloc(span_type, 0);
    if (span == NULL) {
        Py_DECREF(start);
        Py_DECREF(span_id);
        return NULL;
    }
    SLOT(span, S_PUT) = Py_NewRef(args[0]);
    SLOT(span, S_NAME) = Py_NewRef(args[1]);
    SLOT(span, S_TRACE) = Py_NewRef(args[2]);
    SLOT(span, S_SPAN) = span_id;
    SLOT(span, S_PARENT) = Py_NewRef(args[3]);
    SLOT(span, S_REMOTE) = Py_NewRef(Py_False);
    SLOT(span, S_STATE) = Py_NewRef(args[7]);
    SLOT(span, S_KIND) = Py_NewRef(args[4]);
    SLOT(span, S_ATTRS) = Py_NewRef(args[5]);
    SLOT(span, S_START) = start;
    SLOT(span, S_END) = Py_NewRef(zero);
    SLOT(span, S_STATUS) = Py_NewRef(Py_None);
    SLOT(span, S_LINKS) = Py_NewRef(Py_None);
    SLOT(span, S_EVENTS) = Py_NewRef(empty);
    return span;
}

static int u64_of(PyObject *v, uint64_t *out) {
    if (v == NULL || !PyLong_CheckExact(v)) return 0;
    *out = PyLong_AsUnsignedLongLong(v);
    if (*out == (uint64_t)-1 && PyErr_Occurred()) {
        PyErr_Clear(); /* negative or past 64 bits: the Python encoder's to write (or refuse) */
        return 0;
    }
    return 1;
}

/* One span's Span field appended to `b`: 1 written, 0 left to the Python encoder (`b` as it was), -1 error. */
static int put_span(Buf *b, PyObject *span) {
    PyObject *events = SLOT(span, S_EVENTS), *links = SLOT(span, S_LINKS), *status = SLOT(span, S_STATUS);
    PyObject *state = SLOT(span, S_STATE), *name = SLOT(span, S_NAME), *kind_obj = SLOT(span, S_KIND);
    PyObject *attrs = SLOT(span, S_ATTRS), *remote = SLOT(span, S_REMOTE), *trace = SLOT(span, S_TRACE);
    if (events == NULL || !PyTuple_CheckExact(events) || PyTuple_GET_SIZE(events) != 0) return 0;
    if (links != Py_None || status != Py_None || state != Py_None) return 0;
    if (name == NULL || !PyUnicode_CheckExact(name) || attrs == NULL || !PyDict_CheckExact(attrs)) return 0;
    if (remote != Py_True && remote != Py_False) return 0;
    uint64_t span_id, parent_id, start, end, kind;
    if (!u64_of(SLOT(span, S_SPAN), &span_id) || !u64_of(SLOT(span, S_PARENT), &parent_id) ||
        !u64_of(SLOT(span, S_START), &start) || !u64_of(SLOT(span, S_END), &end) || !u64_of(kind_obj, &kind) ||
        kind > 4 || trace == NULL || !PyLong_CheckExact(trace))
        return 0;
    Parts s = {.span_id = span_id, .parent_id = parent_id, .start = start, .end = end, .kind = kind};
    if (_PyLong_AsByteArray((PyLongObject *)trace, s.trace_id, 16, 0, 0) < 0) {
        PyErr_Clear();
        return 0;
    }
    s.name = PyUnicode_AsUTF8AndSize(name, &s.name_len);
    if (s.name == NULL) {
        PyErr_Clear();
        return 0;
    }
    /* status (field 15) present and empty, as the SDK's encoder writes it; then flags (field 16,
       fixed32): "has is_remote", and the parent's is_remote */
    static const unsigned char tail_local[] = {0x7A, 0x00, 0x85, 0x01, 0x00, 0x01, 0x00, 0x00};
    static const unsigned char tail_remote[] = {0x7A, 0x00, 0x85, 0x01, 0x00, 0x03, 0x00, 0x00};
    s.tail = remote == Py_True ? tail_remote : tail_local;
    s.tail_len = 8;
    s.state = "";
    s.attributes = attrs;
    return put_field(b, &s);
}

static PyObject *traceparent(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    /* (trace_id, span_id) -> the W3C traceparent naming that span, sampled: "00-<32 hex>-<16 hex>-01" */
    if (nargs != 2 || !PyLong_Check(args[0]) || !PyLong_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "traceparent(trace_id: int, span_id: int)");
        return NULL;
    }
    unsigned char ids[24];
    if (_PyLong_AsByteArray((PyLongObject *)args[0], ids, 16, 0, 0) < 0 ||
        _PyLong_AsByteArray((PyLongObject *)args[1], ids + 16, 8, 0, 0) < 0)
        return NULL;
    static const char hex[] = "0123456789abcdef";
    char out[55];
    memcpy(out, "00-", 3);
    for (int i = 0; i < 24; i++) {
        int at = 3 + 2 * i + (i >= 16);
        out[at] = hex[ids[i] >> 4];
        out[at + 1] = hex[ids[i] & 15];
    }
    out[35] = '-';
    memcpy(out + 52, "-01", 3);
    return PyUnicode_FromStringAndSize(out, 55);
}

static PyObject *span_fields(PyObject *self, PyObject *spans) {
    /* (spans: list) -> (bytes of the Span fields it wrote, list of the spans it left, in order) */
    if (!PyList_CheckExact(spans)) {
        PyErr_SetString(PyExc_TypeError, "span_fields(spans: list)");
        return NULL;
    }
    if (span_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "span_fields before configure(LeanSpan)");
        return NULL;
    }
    PyObject *rest = PyList_New(0);
    if (rest == NULL) return NULL;
    Buf b;
    buf_init(&b);
    Py_ssize_t count = PyList_GET_SIZE(spans);
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *span = PyList_GET_ITEM(spans, i);
        int r = Py_IS_TYPE(span, span_type) ? put_span(&b, span) : 0;
        if (r < 0 || (r == 0 && PyList_Append(rest, span) < 0)) {
            buf_free(&b);
            Py_DECREF(rest);
            return NULL;
        }
    }
    PyObject *out = PyBytes_FromStringAndSize((const char *)b.p, b.len);
    buf_free(&b);
    if (out == NULL) {
        Py_DECREF(rest);
        return NULL;
    }
    return Py_BuildValue("(NN)", out, rest);
}

static PyMethodDef methods[] = {
    {"span_field", (PyCFunction)(void (*)(void))span_field, METH_FASTCALL,
     "A request-path span's OTLP Span field (bytes), or None where the Python encoder must write it."},
    {"configure", (PyCFunction)(void (*)(void))configure, METH_FASTCALL,
     "Where the slots of the span class live, and the function that draws span ids."},
    {"traceparent", (PyCFunction)(void (*)(void))traceparent, METH_FASTCALL,
     "The W3C traceparent of a sampled span: traceparent(trace_id, span_id)."},
    {"new_span", (PyCFunction)(void (*)(void))new_span, METH_FASTCALL, "An open span of the configured class."},
    {"span_fields", span_fields, METH_O,
     "The Span fields of the common spans of a list, as one bytes object, and the list of the others."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_spanwire", NULL, 0, methods};

PyMODINIT_FUNC PyInit__spanwire(void) { return PyModule_Create(&module); }
