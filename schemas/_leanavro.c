/* Lean Avro binary decoding and encoding along a field plan (schemas/lean.py builds the plans).
 *
 * A plan is a tuple of (name or None, kind) for the fields of one flat record schema, in order. Decoding
 * builds a dict of the named fields and skips the unnamed ones without allocating; encoding writes the
 * record the way fastavro's schemaless_writer does, and answers None for
 * anything outside the plain path (a value of another Python type, a missing field, a string that
 * does not encode), so the caller lets fastavro decide it.
 *
 * The bytes are untrusted: every read is bounds-checked (_avroread.h), a varint is at most 10 bytes and
 * 64 bits, a string length is never negative nor past the end. Anything that does not decode raises the error
 * class given to the plan (MalformedRecord), never a crash, with the byte where it went wrong.
 */
#include "_avroread.h"

/* The field kinds, numbered as schemas/lean.py numbers them. */
enum { K_STRING, K_LONG, K_DOUBLE, K_BOOLEAN, K_OPT_STRING, K_OPT_LONG, K_OPT_DOUBLE, K_COUNT };

typedef struct PlanObject {
    PyObject_HEAD
    Py_ssize_t n;
    int *kinds;
    PyObject **names; /* owned references; NULL for a field that is skipped */
    PyObject *error;  /* the exception class raised for bytes that do not decode */
    PyObject *label;  /* what the messages call the body ("body") */
} PlanObject;

static PyTypeObject PlanType;

/* ---- decoding (reading: _avroread.h) ---------------------------------------------------------- */

/* Errors are reported with the reader's error class and label: the outermost plan's. */
static int walk_fields(PlanObject *plan, AvroReader *r, PyObject *out) {
    for (Py_ssize_t i = 0; i < plan->n; i++) {
        int kind = plan->kinds[i];
        PyObject *name = plan->names[i];
        PyObject *value = NULL;
        if (kind >= K_OPT_STRING && kind <= K_OPT_DOUBLE) {
            int present;
            if (avro_read_optional(r, &present) < 0)
                return -1;
            if (!present) {
                if (name != NULL && PyDict_SetItem(out, name, Py_None) < 0)
                    return -1;
                continue;
            }
            kind = kind == K_OPT_STRING ? K_STRING : kind == K_OPT_LONG ? K_LONG : K_DOUBLE;
        }
        switch (kind) {
        case K_STRING: {
            Py_ssize_t at, len;
            if (avro_read_string(r, &at, &len) < 0)
                return -1;
            if (name != NULL) {
                value = PyUnicode_DecodeUTF8((const char *)r->d + at, len, NULL);
                if (value == NULL) {
                    PyErr_Clear();
                    avro_fail(r, "string is not UTF-8", at);
                    return -1;
                }
            }
            break;
        }
        case K_LONG: {
            int64_t v;
            if (avro_read_long(r, &v) < 0)
                return -1;
            if (name != NULL && (value = PyLong_FromLongLong(v)) == NULL)
                return -1;
            break;
        }
        case K_DOUBLE: {
            double v;
            if (avro_read_double(r, &v) < 0)
                return -1;
            if (name != NULL && (value = PyFloat_FromDouble(v)) == NULL)
                return -1;
            break;
        }
        case K_BOOLEAN:
            if (r->pos >= r->end) {
                avro_fail(r, "truncated boolean", r->pos);
                return -1;
            }
            if (name != NULL) {
                value = r->d[r->pos] ? Py_True : Py_False;
                Py_INCREF(value);
            }
            r->pos++;
            break;
        default:
            PyErr_SetString(PyExc_SystemError, "bad kind in plan");
            return -1;
        }
        if (value != NULL) {
            int rc = PyDict_SetItem(out, name, value);
            Py_DECREF(value);
            if (rc < 0)
                return -1;
        }
    }
    return 0;
}


static PyObject *Plan_decode(PlanObject *self, PyObject *const *args, Py_ssize_t nargs) {
    AvroReader r;
    if (avro_reader_from_args(args, nargs, "decode(data: bytes, pos: int)", self->error, self->label, &r) < 0)
        return NULL;
    PyObject *out = PyDict_New();
    if (out == NULL)
        return NULL;
    if (walk_fields(self, &r, out) < 0) {
        Py_DECREF(out);
        return NULL;
    }
    if (r.pos != r.end) {
        PyErr_Format(self->error, "%U does not decode (%zd bytes): %zd trailing bytes", self->label, r.end,
                     r.end - r.pos);
        Py_DECREF(out);
        return NULL;
    }
    return out;
}

/* ---- encoding -------------------------------------------------------------------------------- */

typedef struct {
    unsigned char *buf;
    Py_ssize_t len, cap;
    unsigned char small[512];
} Writer;

static int reserve(Writer *w, Py_ssize_t more) {
    if (w->len + more <= w->cap)
        return 0;
    Py_ssize_t cap = w->cap;
    while (cap < w->len + more)
        cap *= 2;
    unsigned char *buf = PyMem_Malloc((size_t)cap);
    if (buf == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    memcpy(buf, w->buf, (size_t)w->len);
    if (w->buf != w->small)
        PyMem_Free(w->buf);
    w->buf = buf;
    w->cap = cap;
    return 0;
}

static int write_long(Writer *w, int64_t v) {
    if (reserve(w, 10) < 0)
        return -1;
    uint64_t n = ((uint64_t)v << 1) ^ (uint64_t)(v >> 63);
    while (n >= 0x80) {
        w->buf[w->len++] = (unsigned char)(n | 0x80);
        n >>= 7;
    }
    w->buf[w->len++] = (unsigned char)n;
    return 0;
}

/* 1: written; 0: not on the plain path (the caller gives the record to fastavro); -1: error set. */
static int write_value(Writer *w, int kind, PyObject *v) {
    switch (kind) {
    case K_STRING: {
        if (!PyUnicode_CheckExact(v))
            return 0;
        Py_ssize_t len;
        const char *s = PyUnicode_AsUTF8AndSize(v, &len);
        if (s == NULL) {
            PyErr_Clear();
            return 0;
        }
        if (write_long(w, len) < 0 || reserve(w, len) < 0)
            return -1;
        memcpy(w->buf + w->len, s, (size_t)len);
        w->len += len;
        return 1;
    }
    case K_LONG: {
        if (!PyLong_CheckExact(v))
            return 0;
        int overflow;
        long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
        if (overflow)
            return 0;
        if (x == -1 && PyErr_Occurred())
            return -1;
        return write_long(w, x) < 0 ? -1 : 1;
    }
    case K_DOUBLE: {
        if (!PyFloat_CheckExact(v))
            return 0;
        double x = PyFloat_AS_DOUBLE(v);
        uint64_t bits;
        memcpy(&bits, &x, sizeof bits);
        if (reserve(w, 8) < 0)
            return -1;
        for (int i = 0; i < 8; i++)
            w->buf[w->len++] = (unsigned char)(bits >> (8 * i));
        return 1;
    }
    case K_BOOLEAN:
        if (v != Py_True && v != Py_False)
            return 0;
        if (reserve(w, 1) < 0)
            return -1;
        w->buf[w->len++] = v == Py_True;
        return 1;
    }
    return 0;
}

static PyObject *Plan_encode(PlanObject *self, PyObject *record) {
    if (!PyDict_Check(record))
        Py_RETURN_NONE;
    Writer w = {NULL, 0, sizeof w.small, {0}};
    w.buf = w.small;
    PyObject *result = NULL;
    for (Py_ssize_t i = 0; i < self->n; i++) {
        PyObject *name = self->names[i];
        if (name == NULL)
            goto plain_path_ends; /* an encoder plan names every field */
        PyObject *v = PyDict_GetItemWithError(record, name);
        if (v == NULL) {
            if (PyErr_Occurred())
                goto done;
            goto plain_path_ends;
        }
        int kind = self->kinds[i];
        if (kind >= K_OPT_STRING && kind <= K_OPT_DOUBLE) {
            if (reserve(&w, 1) < 0)
                goto done;
            if (v == Py_None) {
                w.buf[w.len++] = 0;
                continue;
            }
            w.buf[w.len++] = 2;
            kind = kind == K_OPT_STRING ? K_STRING : kind == K_OPT_LONG ? K_LONG : K_DOUBLE;
        }
        int rc = write_value(&w, kind, v);
        if (rc < 0)
            goto done;
        if (rc == 0)
            goto plain_path_ends;
    }
    result = PyBytes_FromStringAndSize((const char *)w.buf, w.len);
    goto done;
plain_path_ends:
    result = Py_None;
    Py_INCREF(result);
done:
    if (w.buf != w.small)
        PyMem_Free(w.buf);
    return result;
}

/* ---- the type -------------------------------------------------------------------------------- */

static void Plan_dealloc(PlanObject *self) {
    if (self->names != NULL) {
        for (Py_ssize_t i = 0; i < self->n; i++)
            Py_XDECREF(self->names[i]);
        PyMem_Free(self->names);
    }
    PyMem_Free(self->kinds);
    Py_XDECREF(self->error);
    Py_XDECREF(self->label);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int Plan_init(PlanObject *self, PyObject *args, PyObject *kwds) {
    static char *keywords[] = {"fields", "error", "label", NULL};
    PyObject *fields, *error, *label;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!OU", keywords, &PyTuple_Type, &fields, &error, &label))
        return -1;
    if (!PyType_Check(error) || !PyType_IsSubtype((PyTypeObject *)error, (PyTypeObject *)PyExc_Exception)) {
        PyErr_SetString(PyExc_TypeError, "error must be an exception class");
        return -1;
    }
    if (self->kinds != NULL) {
        PyErr_SetString(PyExc_TypeError, "a Plan is built once");
        return -1;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(fields);
    self->kinds = PyMem_Calloc((size_t)(n ? n : 1), sizeof(int));
    self->names = PyMem_Calloc((size_t)(n ? n : 1), sizeof(PyObject *));
    if (self->kinds == NULL || self->names == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    self->n = n;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *f = PyTuple_GET_ITEM(fields, i), *name;
        int kind;
        if (!PyArg_ParseTuple(f, "Oi;a field is (name or None, kind)", &name, &kind))
            return -1;
        if (kind < 0 || kind >= K_COUNT) {
            PyErr_Format(PyExc_ValueError, "kind %d out of range", kind);
            return -1;
        }
        if (name != Py_None) {
            if (!PyUnicode_Check(name)) {
                PyErr_SetString(PyExc_TypeError, "a field name is a str or None");
                return -1;
            }
            Py_INCREF(name);
            PyUnicode_InternInPlace(&name);
            self->names[i] = name;
        }
        self->kinds[i] = kind;
    }
    Py_INCREF(error);
    self->error = error;
    Py_INCREF(label);
    self->label = label;
    return 0;
}

static PyMethodDef Plan_methods[] = {
    {"decode", (PyCFunction)(void (*)(void))Plan_decode, METH_FASTCALL,
     "decode(data: bytes, pos: int) -> dict: the record encoded in data[pos:], its named fields."},
    {"encode", (PyCFunction)Plan_encode, METH_O,
     "encode(record: dict) -> bytes | None: the flat record's body, None off the plain path."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject PlanType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "schemas._leanavro.Plan",
    .tp_basicsize = sizeof(PlanObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Plan(fields, error, label): a flat record schema's fields as (name or None, kind).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Plan_init,
    .tp_dealloc = (destructor)Plan_dealloc,
    .tp_methods = Plan_methods,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "schemas._leanavro",
    .m_doc = "Lean Avro decoding and encoding along a field plan.",
    .m_size = -1,
};

PyMODINIT_FUNC PyInit__leanavro(void) {
    if (PyType_Ready(&PlanType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&PlanType);
    if (PyModule_AddObject(m, "Plan", (PyObject *)&PlanType) < 0) {
        Py_DECREF(&PlanType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
