/* The common request-path span as its OTLP `Span` field, in C.

   `_encode.encode_span` calls `span_field` for a span without events, links
   or status (every request-path span but an error's); it returns the
   same bytes as the Python encoder, or None where a value is of a kind it
   does not write (a mapping, a nested sequence, an int past 64 bits, a
   string that is not valid UTF-8, None, any other object): the Python
   encoder then writes the span (and raises for what OTLP cannot carry).
   Built as an optional extension: without a compiler the Python encoder
   writes every span. Field numbers as in `_encode.py`. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

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
    Buf b;
    b.p = b.small;
    b.len = 0;
    b.cap = (Py_ssize_t)sizeof(b.small);
    Py_ssize_t head_len = PyBytes_GET_SIZE(args[4]), state_len = PyBytes_GET_SIZE(args[7]);
    Py_ssize_t tail_len = PyBytes_GET_SIZE(args[9]);
    if (buf_reserve(&b, 64 + head_len + state_len) < 0) return NULL;
    b.p[b.len++] = 0x0A; /* trace_id: 16 bytes */
    b.p[b.len++] = 16;
    put_be64(&b, ids[0]);
    put_be64(&b, ids[1]);
    b.p[b.len++] = 0x12; /* span_id */
    b.p[b.len++] = 8;
    put_be64(&b, ids[2]);
    if (ids[3]) {
        b.p[b.len++] = 0x22; /* parent_span_id */
        b.p[b.len++] = 8;
        put_be64(&b, ids[3]);
    }
    put_bytes(&b, PyBytes_AS_STRING(args[4]), head_len);
    b.p[b.len++] = 0x39; /* start_time_unix_nano, fixed64 */
    put_le64(&b, times[0]);
    b.p[b.len++] = 0x41; /* end_time_unix_nano */
    put_le64(&b, times[1]);
    put_bytes(&b, PyBytes_AS_STRING(args[7]), state_len); /* trace_state: its whole field, or nothing */
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    while (PyDict_Next(args[8], &pos, &key, &value)) {
        int r = put_attribute(&b, key, value);
        if (r <= 0) {
            buf_free(&b);
            if (r < 0) return NULL;
            Py_RETURN_NONE;
        }
    }
    if (buf_reserve(&b, tail_len) < 0) {
        buf_free(&b);
        return NULL;
    }
    put_bytes(&b, PyBytes_AS_STRING(args[9]), tail_len);
    Py_ssize_t n = b.len;
    PyObject *out = PyBytes_FromStringAndSize(NULL, 1 + varint_len((uint64_t)n) + n);
    if (out != NULL) {
        unsigned char *o = (unsigned char *)PyBytes_AS_STRING(out);
        *o++ = 0x12; /* ScopeSpans.spans, field 2 */
        uint64_t left = (uint64_t)n;
        while (left >= 0x80) {
            *o++ = (unsigned char)((left & 0x7F) | 0x80);
            left >>= 7;
        }
        *o++ = (unsigned char)left;
        memcpy(o, b.p, n);
    }
    buf_free(&b);
    return out;
}

static PyMethodDef methods[] = {
    {"span_field", (PyCFunction)(void (*)(void))span_field, METH_FASTCALL,
     "A request-path span's OTLP Span field (bytes), or None where the Python encoder must write it."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_spanwire", NULL, 0, methods};

PyMODINIT_FUNC PyInit__spanwire(void) { return PyModule_Create(&module); }
