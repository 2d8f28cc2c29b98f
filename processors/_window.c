/* The node stage's hot path in C: a device's minute window, a node scrape read from its Avro bytes and
 * added to its devices' windows and the coverage map, and one pass over a job's span of a window.
 *
 * - DeviceWindow: one device's minute: three arrays of 60 doubles (NaN = metric absent in that second) and
 *   a seen-mask, inline, with the device's index, model, MIG profile and the sorted mapping versions that
 *   fed it. Not tracked by the cyclic GC (it holds no container): a node stage holds one per device a
 *   minute, which the collector would otherwise walk again and again.
 * - ScrapeReader(fields, items, error, label).read(data, pos) -> Scrape: walks the whole NodeScrape body
 *   once, bounds-checked (schemas/_avroread.h), and keeps the top fields; the devices stay bytes.
 * - absorb(scrape, key, devices, second, last_seen, index_of, unchecked, keys): what
 *   NodePartition.on_scrape and MinuteWindows.add_scrape do with a scrape's devices, in the same order,
 *   without a Python object per device (a node's device keys are made once and kept in `keys`).
 * - span_stats(window, i0, i1): the sums and maxima of a job's seconds [i0, i1) (processors/rollup.py
 *   span_row), left to right as the general path adds them, so both give the same bits.
 */
#include "schemas/_avroread.h"
#include <math.h>
#include <structmember.h>

#define SECONDS 60

/* ---- Window ------------------------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    PyObject *index;       /* int or None */
    PyObject *model;       /* str or None */
    PyObject *mig_profile; /* str or None */
    PyObject *mapping;     /* str: the mapping versions, sorted, comma-joined ("" before the first) */
    long long minute_s;    /* the minute's first second (epoch seconds) */
    double act[SECONDS], fb[SECONDS], pw[SECONDS];
    unsigned char seen[SECONDS];
} WindowObject;

static PyTypeObject WindowType;
static PyObject *EMPTY_STR;

static void window_clear_arrays(WindowObject *w) {
    for (int i = 0; i < SECONDS; i++)
        w->act[i] = w->fb[i] = w->pw[i] = NAN;
    memset(w->seen, 0, sizeof w->seen);
}

/* A window without calling __init__: fields None, "" and NaN. */
static WindowObject *window_alloc(PyTypeObject *type) {
    WindowObject *w = (WindowObject *)type->tp_alloc(type, 0);
    if (w == NULL)
        return NULL;
    Py_INCREF(Py_None);
    w->index = Py_None;
    Py_INCREF(Py_None);
    w->model = Py_None;
    Py_INCREF(Py_None);
    w->mig_profile = Py_None;
    Py_INCREF(EMPTY_STR);
    w->mapping = EMPTY_STR;
    w->minute_s = 0;
    window_clear_arrays(w);
    return w;
}

static void Window_dealloc(WindowObject *w) {
    Py_XDECREF(w->index);
    Py_XDECREF(w->model);
    Py_XDECREF(w->mig_profile);
    Py_XDECREF(w->mapping);
    Py_TYPE(w)->tp_free((PyObject *)w);
}

/* Record second `i` of the minute unless it is there already (the first sample of a second wins). */
static inline int window_put(WindowObject *w, Py_ssize_t i, double act, double fb, double pw) {
    if (w->seen[i])
        return 0;
    w->seen[i] = 1;
    w->act[i] = act;
    w->fb[i] = fb;
    w->pw[i] = pw;
    return 1;
}

/* A metric as Python gives it: None is absent (NaN), anything else a float. */
static int as_metric(PyObject *v, double *out) {
    if (v == Py_None) {
        *out = NAN;
        return 0;
    }
    double x = PyFloat_AsDouble(v);
    if (x == -1.0 && PyErr_Occurred())
        return -1;
    *out = x;
    return 0;
}

/* The place of second `s` in the window's minute, or -1 with IndexError set when it is outside it. */
static Py_ssize_t window_index(const WindowObject *w, long long s) {
    long long i = s - w->minute_s;
    if (i < 0 || i >= SECONDS) {
        PyErr_Format(PyExc_IndexError, "second %lld is outside the window's minute (from %lld)", s, w->minute_s);
        return -1;
    }
    return (Py_ssize_t)i;
}

static PyObject *Window_put(WindowObject *w, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "put(second, act, fb, pw)");
        return NULL;
    }
    long long s = PyLong_AsLongLong(args[0]);
    if (s == -1 && PyErr_Occurred())
        return NULL;
    Py_ssize_t i = window_index(w, s);
    if (i < 0)
        return NULL;
    double a, f, p;
    if (as_metric(args[1], &a) < 0 || as_metric(args[2], &f) < 0 || as_metric(args[3], &p) < 0)
        return NULL;
    return PyBool_FromLong(window_put(w, i, a, f, p));
}

static PyObject *Window_count(WindowObject *w, PyObject *unused) {
    (void)unused;
    Py_ssize_t n = 0;
    for (int i = 0; i < SECONDS; i++)
        n += w->seen[i];
    return PyLong_FromSsize_t(n);
}

static PyObject *or_none(int have, double v) {
    if (!have)
        Py_RETURN_NONE;
    return PyFloat_FromDouble(v);
}

/* {second: (act, fb, pw)} of the sampled seconds, None for an absent metric. */
static PyObject *Window_secs(WindowObject *w, void *closure) {
    (void)closure;
    PyObject *out = PyDict_New();
    if (out == NULL)
        return NULL;
    for (int i = 0; i < SECONDS; i++) {
        if (!w->seen[i])
            continue;
        PyObject *key = PyLong_FromLongLong(w->minute_s + i);
        PyObject *cell = key == NULL ? NULL
                                     : Py_BuildValue("(NNN)", or_none(!isnan(w->act[i]), w->act[i]),
                                                     or_none(!isnan(w->fb[i]), w->fb[i]),
                                                     or_none(!isnan(w->pw[i]), w->pw[i]));
        if (cell == NULL || PyDict_SetItem(out, key, cell) < 0) {
            Py_XDECREF(key);
            Py_XDECREF(cell);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(key);
        Py_DECREF(cell);
    }
    return out;
}

static int put_cell(WindowObject *w, PyObject *second, PyObject *cell) {
    long long s = PyLong_AsLongLong(second);
    if (s == -1 && PyErr_Occurred())
        return -1;
    Py_ssize_t i = window_index(w, s);
    if (i < 0)
        return -1;
    if (!PyTuple_Check(cell) || PyTuple_GET_SIZE(cell) != 3) {
        PyErr_SetString(PyExc_TypeError, "a second's cell is (act, fb, pw)");
        return -1;
    }
    double a, f, p;
    if (as_metric(PyTuple_GET_ITEM(cell, 0), &a) < 0 || as_metric(PyTuple_GET_ITEM(cell, 1), &f) < 0 ||
        as_metric(PyTuple_GET_ITEM(cell, 2), &p) < 0)
        return -1;
    window_put(w, i, a, f, p);
    return 0;
}

/* DeviceWindow(index, model, secs=None, minute_s=None, mig_profile=None): `secs` {second: (act, fb, pw)};
 * the minute is `minute_s`, else the one of the earliest second in `secs`, else 0. */
static int Window_init(WindowObject *w, PyObject *args, PyObject *kwds) {
    static char *keywords[] = {"index", "model", "secs", "minute_s", "mig_profile", NULL};
    PyObject *index, *model, *secs = Py_None, *minute = Py_None, *profile = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO|OOO", keywords, &index, &model, &secs, &minute, &profile))
        return -1;
    if (secs != Py_None && !PyDict_Check(secs)) {
        PyErr_SetString(PyExc_TypeError, "secs is a dict {second: (act, fb, pw)} or None");
        return -1;
    }
    long long minute_s = 0;
    if (minute != Py_None) {
        minute_s = PyLong_AsLongLong(minute);
        if (minute_s == -1 && PyErr_Occurred())
            return -1;
    } else if (secs != Py_None && PyDict_GET_SIZE(secs) > 0) {
        PyObject *key, *value;
        Py_ssize_t pos = 0;
        int first = 1;
        while (PyDict_Next(secs, &pos, &key, &value)) {
            long long s = PyLong_AsLongLong(key);
            if (s == -1 && PyErr_Occurred())
                return -1;
            if (first || s < minute_s)
                minute_s = s;
            first = 0;
        }
        minute_s -= (minute_s % SECONDS + SECONDS) % SECONDS; /* floored, as Python's % */
    }
    Py_INCREF(index);
    Py_SETREF(w->index, index);
    Py_INCREF(model);
    Py_SETREF(w->model, model);
    Py_INCREF(profile);
    Py_SETREF(w->mig_profile, profile);
    Py_INCREF(EMPTY_STR);
    Py_SETREF(w->mapping, EMPTY_STR);
    w->minute_s = minute_s;
    window_clear_arrays(w);
    if (secs != Py_None) {
        PyObject *key, *value;
        Py_ssize_t pos = 0;
        while (PyDict_Next(secs, &pos, &key, &value))
            if (put_cell(w, key, value) < 0)
                return -1;
    }
    return 0;
}

/* add_mapping(version): the versions that fed the window, a set kept sorted and comma-joined. */
static PyObject *Window_add_mapping(WindowObject *w, PyObject *mapping) {
    if (!PyUnicode_Check(mapping)) {
        PyErr_SetString(PyExc_TypeError, "a mapping version is a str");
        return NULL;
    }
    int same = PyUnicode_Compare(w->mapping, mapping) == 0;
    if (same || PyErr_Occurred())
        return same ? Py_NewRef(Py_None) : NULL;
    PyObject *comma = PyUnicode_FromString(","), *parts = NULL, *sorted = NULL, *joined = NULL;
    if (comma == NULL)
        return NULL;
    if (PyUnicode_GET_LENGTH(w->mapping) > 0) {
        PyObject *split = PyUnicode_Split(w->mapping, comma, -1);
        parts = split == NULL ? NULL : PySet_New(split);
        Py_XDECREF(split);
    } else {
        parts = PySet_New(NULL);
    }
    if (parts == NULL)
        goto done;
    int there = PySet_Contains(parts, mapping);
    if (there < 0)
        goto done;
    if (!there) {
        if (PySet_Add(parts, mapping) < 0 || (sorted = PySequence_List(parts)) == NULL || PyList_Sort(sorted) < 0 ||
            (joined = PyUnicode_Join(comma, sorted)) == NULL)
            goto done;
        Py_SETREF(w->mapping, joined);
        joined = NULL;
    }
    Py_DECREF(comma);
    Py_DECREF(parts);
    Py_XDECREF(sorted);
    Py_RETURN_NONE;
done:
    Py_DECREF(comma);
    Py_XDECREF(parts);
    Py_XDECREF(sorted);
    Py_XDECREF(joined);
    return NULL;
}

static PyMemberDef Window_members[] = {
    {"index", T_OBJECT, offsetof(WindowObject, index), READONLY, "the device's index on its node, or None"},
    {"model", T_OBJECT, offsetof(WindowObject, model), READONLY, "the device's model, or None"},
    {"mig_profile", T_OBJECT, offsetof(WindowObject, mig_profile), READONLY, "the MIG profile a sample named, or None"},
    {"mapping", T_OBJECT, offsetof(WindowObject, mapping), READONLY, "the mapping versions, sorted, comma-joined"},
    {"minute_s", T_LONGLONG, offsetof(WindowObject, minute_s), READONLY, "the minute's first second (epoch seconds)"},
    {NULL, 0, 0, 0, NULL},
};

static PyGetSetDef Window_getset[] = {
    {"secs", (getter)Window_secs, NULL, "{second: (act, fb, pw)} of the sampled seconds (None: absent)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef Window_methods[] = {
    {"put", (PyCFunction)(void (*)(void))Window_put, METH_FASTCALL,
     "put(second, act, fb, pw) -> bool: record the second unless it is there (the first sample wins)."},
    {"count", (PyCFunction)Window_count, METH_NOARGS, "count() -> int: the seconds sampled."},
    {"add_mapping", (PyCFunction)Window_add_mapping, METH_O,
     "add_mapping(version): add a mapping version to those that fed the window (kept sorted, comma-joined)."},
    {NULL, NULL, 0, NULL},
};

static PyObject *Window_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    (void)args;
    (void)kwds;
    return (PyObject *)window_alloc(type);
}

static PyTypeObject WindowType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "processors._window.DeviceWindow",
    .tp_basicsize = sizeof(WindowObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "DeviceWindow(index, model, secs=None, minute_s=None, mig_profile=None): one device's minute, per "
              "second activity, framebuffer and power (NaN absent) and a seen-mask.",
    .tp_new = Window_new,
    .tp_init = (initproc)Window_init,
    .tp_dealloc = (destructor)Window_dealloc,
    .tp_members = Window_members,
    .tp_getset = Window_getset,
    .tp_methods = Window_methods,
};

/* ---- span_stats ----------------------------------------------------------------------------------- */

/* span_stats(window, i0, i1) -> (n_seen, n_act, total, max_act, max_fb_act, max_fb, pw_total, n_pw): the
 * seconds sampled; those with an activity, its sum and max; the largest framebuffer use among the seconds
 * with an activity and among all sampled ones; the power sum and how many seconds have one. */
static PyObject *span_stats(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 3 || !PyObject_TypeCheck(args[0], &WindowType)) {
        PyErr_SetString(PyExc_TypeError, "span_stats(window: DeviceWindow, i0: int, i1: int)");
        return NULL;
    }
    WindowObject *w = (WindowObject *)args[0];
    Py_ssize_t i0 = PyLong_AsSsize_t(args[1]), i1 = PyLong_AsSsize_t(args[2]);
    if ((i0 == -1 || i1 == -1) && PyErr_Occurred())
        return NULL;
    if (i0 < 0 || i1 < i0 || i1 > SECONDS) {
        PyErr_SetString(PyExc_ValueError, "need 0 <= i0 <= i1 <= 60");
        return NULL;
    }
    Py_ssize_t n_seen = 0, n_act = 0, n_pw = 0;
    double total = 0.0, max_act = 0.0, max_fb_act = 0.0, max_fb = 0.0, pw_total = 0.0;
    int have_fb_act = 0, have_fb = 0;
    for (Py_ssize_t i = i0; i < i1; i++) {
        if (!w->seen[i])
            continue;
        n_seen++;
        double a = w->act[i], f = w->fb[i], p = w->pw[i];
        int fb_there = f == f;
        if (fb_there) {
            if (!have_fb || f > max_fb)
                max_fb = f;
            have_fb = 1;
        }
        if (a == a) {
            if (n_act == 0 || a > max_act)
                max_act = a;
            total += a;
            n_act++;
            if (fb_there) {
                if (!have_fb_act || f > max_fb_act)
                    max_fb_act = f;
                have_fb_act = 1;
            }
        }
        if (p == p) {
            pw_total += p;
            n_pw++;
        }
    }
    return Py_BuildValue("(nndNNNdn)", n_seen, n_act, total, or_none(n_act > 0, max_act),
                         or_none(have_fb_act, max_fb_act), or_none(have_fb, max_fb), pw_total, n_pw);
}

/* ---- reading a scrape ----------------------------------------------------------------------------- */

/* What a field is to the node stage; the schema's field order comes from the plan (processors/fastdecode.py). */
enum {
    R_SKIP,
    R_CLUSTER,
    R_NODE,
    R_TS,
    R_MAPPING,
    R_DEVICES,
    R_UUID,
    R_INDEX,
    R_MIG,
    R_PROFILE,
    R_MODEL,
    R_SM,
    R_GR,
    R_UTIL,
    R_FB,
    R_POWER,
    R_COUNT
};
/* The wire shapes (schemas/lean.py numbers them the same). */
enum { K_STRING, K_LONG, K_DOUBLE, K_BOOLEAN, K_OPT_STRING, K_OPT_LONG, K_OPT_DOUBLE, K_RECORDS, K_COUNT };
static const Py_ssize_t MIN_BYTES[K_COUNT] = {1, 1, 8, 1, 1, 1, 1, 1};

typedef struct {
    int role, kind;
} Field;

typedef struct {
    PyObject_HEAD
    Py_ssize_t n_top, n_items, item_min;
    Field *top, *items;
    PyObject *error, *label;
} ReaderObject;

typedef struct {
    PyObject_HEAD
    PyObject *data;                 /* the bytes (the devices are read from them again by absorb) */
    PyObject *cluster, *node, *ts_ms, *mapping_version;
    Py_ssize_t devices;             /* how many */
    Py_ssize_t devices_at;          /* where the devices' array starts in data */
    ReaderObject *reader;           /* owned: its plan reads the devices again, its error class and label */
} ScrapeObject;

static PyTypeObject ReaderType, ScrapeType;

/* One value of `kind`, skipped (already-checked bytes or not: every read is bounds-checked). */
static int skip_value(AvroReader *r, int kind) {
    if (kind >= K_OPT_STRING && kind <= K_OPT_DOUBLE) {
        int present;
        if (avro_read_optional(r, &present) < 0)
            return -1;
        if (!present)
            return 0;
        kind -= K_OPT_STRING;
    }
    int64_t v;
    double d;
    Py_ssize_t at, len;
    switch (kind) {
    case K_STRING:
        return avro_read_string(r, &at, &len);
    case K_LONG:
        return avro_read_long(r, &v);
    case K_DOUBLE:
        return avro_read_double(r, &d);
    case K_BOOLEAN:
        if (r->pos >= r->end) {
            avro_fail(r, "truncated boolean", r->pos);
            return -1;
        }
        r->pos++;
        return 0;
    }
    PyErr_SetString(PyExc_SystemError, "bad kind in plan");
    return -1;
}

/* A string field as a str (UTF-8 checked). */
static PyObject *read_str(AvroReader *r) {
    Py_ssize_t at, len;
    if (avro_read_string(r, &at, &len) < 0)
        return NULL;
    PyObject *s = PyUnicode_DecodeUTF8((const char *)r->d + at, len, NULL);
    if (s == NULL) {
        PyErr_Clear();
        avro_fail(r, "string is not UTF-8", at);
    }
    return s;
}

/* Whether the bytes are UTF-8 (ASCII without making a str). */
static int utf8_ok(const unsigned char *d, Py_ssize_t len) {
    for (Py_ssize_t i = 0; i < len; i++) {
        if (d[i] >= 0x80) {
            PyObject *probe = PyUnicode_DecodeUTF8((const char *)d, len, NULL);
            if (probe == NULL) {
                PyErr_Clear();
                return 0;
            }
            Py_DECREF(probe);
            return 1;
        }
    }
    return 1;
}

/* One device's fields as the node stage wants them. */
typedef struct {
    Py_ssize_t uuid_at, uuid_len, profile_at, profile_len, model_at, model_len;
    int has_index, has_mig, has_profile, has_model, has_sm, has_gr, has_util;
    int64_t index, mig;
    double sm, gr, util, fb, power; /* fb and power NaN when absent */
} Device;

/* `check`: the strings it keeps are checked as UTF-8 (the first pass, `read`), so that absorb, which reads
 * the same bytes again, cannot fail half-way through a scrape. */
static int read_device(const ReaderObject *rd, AvroReader *r, Device *dev, int check) {
    dev->has_index = dev->has_mig = dev->has_profile = dev->has_model = dev->has_sm = dev->has_gr = dev->has_util = 0;
    dev->sm = dev->gr = dev->util = dev->fb = dev->power = NAN;
    for (Py_ssize_t i = 0; i < rd->n_items; i++) {
        int role = rd->items[i].role, kind = rd->items[i].kind;
        if (role == R_SKIP) {
            if (skip_value(r, kind) < 0)
                return -1;
            continue;
        }
        int present = 1;
        if (kind >= K_OPT_STRING && kind <= K_OPT_DOUBLE) {
            if (avro_read_optional(r, &present) < 0)
                return -1;
            kind -= K_OPT_STRING;
        }
        if (!present)
            continue;
        switch (kind) {
        case K_STRING: {
            Py_ssize_t at, len;
            if (avro_read_string(r, &at, &len) < 0)
                return -1;
            if (check && !utf8_ok(r->d + at, len)) {
                avro_fail(r, "string is not UTF-8", at);
                return -1;
            }
            if (role == R_UUID) {
                dev->uuid_at = at;
                dev->uuid_len = len;
            } else if (role == R_PROFILE) {
                dev->profile_at = at;
                dev->profile_len = len;
                dev->has_profile = 1;
            } else if (role == R_MODEL) {
                dev->model_at = at;
                dev->model_len = len;
                dev->has_model = 1;
            }
            break;
        }
        case K_LONG: {
            int64_t v;
            if (avro_read_long(r, &v) < 0)
                return -1;
            if (role == R_INDEX) {
                dev->index = v;
                dev->has_index = 1;
            } else if (role == R_MIG) {
                dev->mig = v;
                dev->has_mig = 1;
            }
            break;
        }
        case K_DOUBLE: {
            double v;
            if (avro_read_double(r, &v) < 0)
                return -1;
            if (role == R_SM) {
                dev->sm = v;
                dev->has_sm = 1;
            } else if (role == R_GR) {
                dev->gr = v;
                dev->has_gr = 1;
            } else if (role == R_UTIL) {
                dev->util = v;
                dev->has_util = 1;
            }
            else if (role == R_FB)
                dev->fb = v;
            else if (role == R_POWER)
                dev->power = v;
            break;
        }
        default:
            if (skip_value(r, kind) < 0)
                return -1;
        }
    }
    return 0;
}

static PyObject *Reader_read(ReaderObject *self, PyObject *const *args, Py_ssize_t nargs) {
    AvroReader r;
    if (avro_reader_from_args(args, nargs, "read(data: bytes, pos: int)", self->error, self->label, &r) < 0)
        return NULL;
    ScrapeObject *sc = PyObject_New(ScrapeObject, &ScrapeType);
    if (sc == NULL)
        return NULL;
    sc->cluster = sc->node = sc->ts_ms = sc->mapping_version = NULL;
    sc->devices = 0;
    sc->devices_at = -1;
    Py_INCREF(args[0]);
    sc->data = args[0];
    Py_INCREF(self);
    sc->reader = self;
    for (Py_ssize_t i = 0; i < self->n_top; i++) {
        int role = self->top[i].role, kind = self->top[i].kind;
        PyObject **slot = role == R_CLUSTER ? &sc->cluster
                          : role == R_NODE  ? &sc->node
                          : role == R_MAPPING ? &sc->mapping_version
                          : role == R_TS      ? &sc->ts_ms
                                              : NULL;
        if (role == R_DEVICES) {
            sc->devices_at = r.pos;
            for (;;) {
                int64_t count;
                if (avro_read_block(&r, self->item_min, &count) < 0)
                    goto error;
                if (count == 0)
                    break;
                for (int64_t k = 0; k < count; k++) {
                    Device dev;
                    if (read_device(self, &r, &dev, 1) < 0)
                        goto error;
                }
                sc->devices += (Py_ssize_t)count;
            }
        } else if (slot != NULL && kind == K_STRING) {
            Py_CLEAR(*slot);
            if ((*slot = read_str(&r)) == NULL)
                goto error;
        } else if (slot != NULL && kind == K_LONG) {
            int64_t v;
            if (avro_read_long(&r, &v) < 0)
                goto error;
            Py_CLEAR(*slot);
            if ((*slot = PyLong_FromLongLong(v)) == NULL)
                goto error;
        } else if (skip_value(&r, kind) < 0) {
            goto error;
        }
    }
    if (r.pos != r.end) {
        PyErr_Format(self->error, "%U does not decode (%zd bytes): %zd trailing bytes", self->label, r.end,
                     r.end - r.pos);
        goto error;
    }
    return (PyObject *)sc;
error:
    Py_DECREF(sc);
    return NULL;
}

static void Scrape_dealloc(ScrapeObject *sc) {
    Py_XDECREF(sc->data);
    Py_XDECREF(sc->cluster);
    Py_XDECREF(sc->node);
    Py_XDECREF(sc->ts_ms);
    Py_XDECREF(sc->mapping_version);
    Py_XDECREF((PyObject *)sc->reader);
    PyObject_Free(sc);
}

static PyMemberDef Scrape_members[] = {
    {"cluster", T_OBJECT, offsetof(ScrapeObject, cluster), READONLY, "the cluster"},
    {"node", T_OBJECT, offsetof(ScrapeObject, node), READONLY, "the node"},
    {"ts_ms", T_OBJECT, offsetof(ScrapeObject, ts_ms), READONLY, "the scrape's event time (epoch ms)"},
    {"mapping_version", T_OBJECT, offsetof(ScrapeObject, mapping_version), READONLY, "the field mapping's version"},
    {"devices", T_PYSSIZET, offsetof(ScrapeObject, devices), READONLY, "how many device samples it holds"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject ScrapeType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "processors._window.Scrape",
    .tp_basicsize = sizeof(ScrapeObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A node scrape read and checked whole: its top fields; absorb() adds its devices to windows.",
    .tp_dealloc = (destructor)Scrape_dealloc,
    .tp_members = Scrape_members,
};

/* ---- absorb ---------------------------------------------------------------------------------------- */

static PyObject *opt_long(int have, int64_t v) {
    if (!have)
        Py_RETURN_NONE;
    return PyLong_FromLongLong(v);
}

static PyObject *opt_str(int have, const unsigned char *d, Py_ssize_t at, Py_ssize_t len) {
    if (!have)
        Py_RETURN_NONE;
    return PyUnicode_DecodeUTF8((const char *)d + at, len, NULL);
}

/* `sm_active_ratio`, else `gr_engine_active_ratio`, else `gpu_util_pct / 100`, the first present (not
 * null), as processors/classify.py activity_of; NaN when none (a NaN present stays NaN, as there). */
static inline double activity(const Device *dev) {
    if (dev->has_sm)
        return dev->sm;
    if (dev->has_gr)
        return dev->gr;
    if (dev->has_util)
        return dev->util / 100.0;
    return NAN;
}

/* Whether `dk`, a key (node, uuid, mig_instance_id) kept for this node, names this device sample. */
static int same_device(PyObject *dk, const unsigned char *d, const Device *dev) {
    if (!PyTuple_CheckExact(dk) || PyTuple_GET_SIZE(dk) != 3)
        return 0;
    PyObject *uuid = PyTuple_GET_ITEM(dk, 1), *mig = PyTuple_GET_ITEM(dk, 2);
    if (!PyUnicode_CheckExact(uuid))
        return 0;
    const void *bytes;
    Py_ssize_t len;
    if (PyUnicode_IS_COMPACT_ASCII(uuid)) {
        bytes = PyUnicode_DATA(uuid);
        len = PyUnicode_GET_LENGTH(uuid);
    } else if ((bytes = PyUnicode_AsUTF8AndSize(uuid, &len)) == NULL) {
        PyErr_Clear();
        return 0;
    }
    if (len != dev->uuid_len || memcmp(bytes, d + dev->uuid_at, (size_t)len) != 0)
        return 0;
    if (mig == Py_None)
        return !dev->has_mig;
    if (!dev->has_mig || !PyLong_CheckExact(mig))
        return 0;
    int overflow;
    long long v = PyLong_AsLongLongAndOverflow(mig, &overflow);
    return !overflow && v == dev->mig;
}

/* absorb(scrape, key, devices, second, last_seen, index_of, unchecked, keys) -> None
 *
 * For each device sample, in order, with dk = (key, uuid, mig_instance_id):
 *   last_seen[dk] = scrape.ts_ms; a dk not in index_of gets its index there and is appended to unchecked;
 *   then, when `devices` (the open minute's windows) is not None: its window (a new DeviceWindow of the
 *   minute of `second` if none) records second `second` unless it has it, and then takes the scrape's
 *   mapping version (window.add_mapping) if its own differs.
 * keys[key] is the tuple of the node's device keys in the order of its last scrape: a sample naming the
 * device its place names takes that tuple (no str, no tuple made; the dicts find it by identity).
 */
static PyObject *absorb(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 8 || !PyObject_TypeCheck(args[0], &ScrapeType) || !PyUnicode_Check(args[1]) ||
        (args[2] != Py_None && !PyDict_CheckExact(args[2])) || !PyDict_CheckExact(args[4]) ||
        !PyDict_CheckExact(args[5]) || !PyList_CheckExact(args[6]) || !PyDict_CheckExact(args[7])) {
        PyErr_SetString(PyExc_TypeError, "absorb(scrape: Scrape, key: str, devices: dict | None, second: int, "
                                         "last_seen: dict, index_of: dict, unchecked: list, keys: dict)");
        return NULL;
    }
    ScrapeObject *sc = (ScrapeObject *)args[0];
    PyObject *key = args[1], *devices = args[2], *last_seen = args[4], *index_of = args[5], *unchecked = args[6];
    PyObject *keys = args[7];
    long long second = PyLong_AsLongLong(args[3]);
    if (second == -1 && PyErr_Occurred())
        return NULL;
    long long minute_s = second - (second % SECONDS + SECONDS) % SECONDS; /* floored, as Python's % */
    const ReaderObject *rd = sc->reader;
    AvroReader r = {(const unsigned char *)PyBytes_AS_STRING(sc->data), PyBytes_GET_SIZE(sc->data), sc->devices_at,
                    rd->error, rd->label};
    if (sc->devices_at < 0)
        Py_RETURN_NONE;
    PyObject *kept = PyDict_GetItemWithError(keys, key); /* borrowed */
    if (kept == NULL && PyErr_Occurred())
        return NULL;
    Py_ssize_t n_kept = kept != NULL && PyTuple_CheckExact(kept) ? PyTuple_GET_SIZE(kept) : 0;
    Py_INCREF(key);
    Py_XINCREF(kept); /* held: a dict operation below may run code that replaces keys[key] */
    PyObject *fresh = NULL; /* this scrape's keys, made from the first one that differs from those kept */
    PyObject *result = NULL;
    Py_ssize_t k = 0;
    for (;;) {
        int64_t count;
        if (avro_read_block(&r, rd->item_min, &count) < 0)
            goto done;
        if (count == 0)
            break;
        for (int64_t c = 0; c < count; c++, k++) {
            Device dev;
            if (read_device(rd, &r, &dev, 0) < 0)
                goto done;
            PyObject *dk = NULL;
            if (fresh == NULL && k < n_kept && same_device(PyTuple_GET_ITEM(kept, k), r.d, &dev)) {
                dk = PyTuple_GET_ITEM(kept, k);
                Py_INCREF(dk);
            } else {
                PyObject *uuid = PyUnicode_DecodeUTF8((const char *)r.d + dev.uuid_at, dev.uuid_len, NULL);
                PyObject *mig = uuid == NULL ? NULL : opt_long(dev.has_mig, dev.mig);
                dk = mig == NULL ? NULL : PyTuple_Pack(3, key, uuid, mig);
                Py_XDECREF(uuid);
                Py_XDECREF(mig);
                if (dk == NULL)
                    goto done;
                if (fresh == NULL) {
                    if ((fresh = PyList_New(0)) == NULL) {
                        Py_DECREF(dk);
                        goto done;
                    }
                    for (Py_ssize_t j = 0; j < k; j++)
                        if (PyList_Append(fresh, PyTuple_GET_ITEM(kept, j)) < 0) {
                            Py_DECREF(dk);
                            goto done;
                        }
                }
            }
            if (fresh != NULL && PyList_Append(fresh, dk) < 0)
                goto fail_dk;
            if (PyDict_SetItem(last_seen, dk, sc->ts_ms) < 0)
                goto fail_dk;
            int known = PyDict_Contains(index_of, dk);
            if (known < 0)
                goto fail_dk;
            if (!known) {
                PyObject *index = opt_long(dev.has_index, dev.index);
                if (index == NULL)
                    goto fail_dk;
                int rc = PyDict_SetItem(index_of, dk, index);
                Py_DECREF(index);
                if (rc < 0 || PyList_Append(unchecked, dk) < 0)
                    goto fail_dk;
            }
            if (devices != Py_None) {
                WindowObject *w = (WindowObject *)PyDict_GetItemWithError(devices, dk);
                if (w == NULL) {
                    if (PyErr_Occurred())
                        goto fail_dk;
                    w = window_alloc(&WindowType);
                    if (w == NULL)
                        goto fail_dk;
                    w->minute_s = minute_s;
                    PyObject *index = opt_long(dev.has_index, dev.index);
                    PyObject *model = opt_str(dev.has_model, r.d, dev.model_at, dev.model_len);
                    PyObject *profile = opt_str(dev.has_profile, r.d, dev.profile_at, dev.profile_len);
                    if (index == NULL || model == NULL || profile == NULL) {
                        Py_XDECREF(index);
                        Py_XDECREF(model);
                        Py_XDECREF(profile);
                        Py_DECREF(w);
                        goto fail_dk;
                    }
                    Py_SETREF(w->index, index);
                    Py_SETREF(w->model, model);
                    Py_SETREF(w->mig_profile, profile);
                    int rc = PyDict_SetItem(devices, dk, (PyObject *)w);
                    Py_DECREF(w); /* the dict holds it */
                    if (rc < 0)
                        goto fail_dk;
                } else if (!PyObject_TypeCheck((PyObject *)w, &WindowType)) {
                    PyErr_SetString(PyExc_TypeError, "an open minute holds something that is not a DeviceWindow");
                    goto fail_dk;
                }
                Py_ssize_t i = window_index(w, second);
                if (i < 0)
                    goto fail_dk;
                if (window_put(w, i, activity(&dev), dev.fb, dev.power) && w->mapping != sc->mapping_version) {
                    PyObject *rc = Window_add_mapping(w, sc->mapping_version);
                    if (rc == NULL)
                        goto fail_dk;
                    Py_DECREF(rc);
                }
            }
            Py_DECREF(dk);
            continue;
        fail_dk:
            Py_DECREF(dk);
            goto done;
        }
    }
    if (fresh == NULL && k != n_kept) { /* fewer devices than kept: the first k */
        if ((fresh = PyList_New(0)) == NULL)
            goto done;
        for (Py_ssize_t j = 0; j < k && j < n_kept; j++)
            if (PyList_Append(fresh, PyTuple_GET_ITEM(kept, j)) < 0)
                goto done;
    }
    if (fresh != NULL) {
        PyObject *t = PyList_AsTuple(fresh);
        if (t == NULL)
            goto done;
        int rc = PyDict_SetItem(keys, key, t);
        Py_DECREF(t);
        if (rc < 0)
            goto done;
    }
    result = Py_None;
    Py_INCREF(result);
done:
    Py_XDECREF(fresh);
    Py_XDECREF(kept);
    Py_DECREF(key);
    return result;
}

/* ---- the reader type ---------------------------------------------------------------------------- */

static int parse_fields(PyObject *fields, Field **out, Py_ssize_t *n) {
    if (!PyTuple_Check(fields)) {
        PyErr_SetString(PyExc_TypeError, "fields are a tuple of (role, kind)");
        return -1;
    }
    *n = PyTuple_GET_SIZE(fields);
    *out = PyMem_Calloc((size_t)(*n ? *n : 1), sizeof(Field));
    if (*out == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < *n; i++) {
        int role, kind;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(fields, i), "ii;a field is (role, kind)", &role, &kind))
            return -1;
        if (role < 0 || role >= R_COUNT || kind < 0 || kind >= K_COUNT) {
            PyErr_Format(PyExc_ValueError, "role %d or kind %d out of range", role, kind);
            return -1;
        }
        (*out)[i].role = role;
        (*out)[i].kind = kind;
    }
    return 0;
}

static int Reader_init(ReaderObject *self, PyObject *args, PyObject *kwds) {
    static char *keywords[] = {"fields", "items", "error", "label", NULL};
    PyObject *fields, *items, *error, *label;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOU", keywords, &fields, &items, &error, &label))
        return -1;
    if (self->top != NULL) {
        PyErr_SetString(PyExc_TypeError, "a ScrapeReader is built once");
        return -1;
    }
    if (!PyType_Check(error) || !PyType_IsSubtype((PyTypeObject *)error, (PyTypeObject *)PyExc_Exception)) {
        PyErr_SetString(PyExc_TypeError, "error must be an exception class");
        return -1;
    }
    if (parse_fields(fields, &self->top, &self->n_top) < 0 || parse_fields(items, &self->items, &self->n_items) < 0)
        return -1;
    int uuid = 0, once[R_DEVICES + 1] = {0};
    for (Py_ssize_t i = 0; i < self->n_top; i++) {
        Field f = self->top[i];
        if (f.role > R_SKIP && f.role <= R_DEVICES)
            once[f.role]++;
        else if (f.role != R_SKIP) {
            PyErr_Format(PyExc_ValueError, "field %zd: role %d is a device's", i, f.role);
            return -1;
        }
        if (f.kind == K_RECORDS && f.role != R_DEVICES) {
            PyErr_SetString(PyExc_ValueError, "only the devices field is an array of records");
            return -1;
        }
        if ((f.role == R_CLUSTER || f.role == R_NODE || f.role == R_MAPPING) && f.kind != K_STRING) {
            PyErr_SetString(PyExc_ValueError, "cluster, node and mapping_version are strings");
            return -1;
        }
        if (f.role == R_TS && f.kind != K_LONG) {
            PyErr_SetString(PyExc_ValueError, "ts_ms is a long");
            return -1;
        }
    }
    Py_ssize_t m = 0;
    for (Py_ssize_t i = 0; i < self->n_items; i++) {
        Field f = self->items[i];
        uuid += f.role == R_UUID;
        if (f.kind == K_RECORDS || (f.role == R_UUID && f.kind != K_STRING) ||
            ((f.role == R_PROFILE || f.role == R_MODEL) && f.kind != K_OPT_STRING && f.kind != K_STRING) ||
            ((f.role == R_INDEX || f.role == R_MIG) && f.kind != K_OPT_LONG && f.kind != K_LONG) ||
            (f.role >= R_SM && f.kind != K_OPT_DOUBLE && f.kind != K_DOUBLE)) {
            PyErr_Format(PyExc_ValueError, "device field %zd: role %d cannot have kind %d", i, f.role, f.kind);
            return -1;
        }
        m += MIN_BYTES[f.kind];
    }
    int each_once = uuid == 1;
    for (int role = R_CLUSTER; role <= R_DEVICES; role++)
        each_once &= once[role] == 1;
    if (!each_once) {
        PyErr_SetString(PyExc_ValueError,
                        "a scrape plan names cluster, node, ts_ms, mapping_version, the devices and their uuid once each");
        return -1;
    }
    self->item_min = m > 0 ? m : 1;
    Py_INCREF(error);
    self->error = error;
    Py_INCREF(label);
    self->label = label;
    return 0;
}

static void Reader_dealloc(ReaderObject *self) {
    PyMem_Free(self->top);
    PyMem_Free(self->items);
    Py_XDECREF(self->error);
    Py_XDECREF(self->label);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef Reader_methods[] = {
    {"read", (PyCFunction)(void (*)(void))Reader_read, METH_FASTCALL,
     "read(data: bytes, pos: int) -> Scrape: the body in data[pos:], checked whole; raises the error class."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject ReaderType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "processors._window.ScrapeReader",
    .tp_basicsize = sizeof(ReaderObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "ScrapeReader(fields, items, error, label): a NodeScrape schema's fields as (role, kind).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Reader_init,
    .tp_dealloc = (destructor)Reader_dealloc,
    .tp_methods = Reader_methods,
};

/* ---- the module ----------------------------------------------------------------------------------- */

static PyMethodDef methods[] = {
    {"span_stats", (PyCFunction)(void (*)(void))span_stats, METH_FASTCALL,
     "span_stats(window, i0, i1) -> (n_seen, n_act, total, max_act, max_fb_act, max_fb, pw_total, n_pw)"},
    {"absorb", (PyCFunction)(void (*)(void))absorb, METH_FASTCALL,
     "absorb(scrape, key, devices, second, last_seen, index_of, unchecked, keys) -> None"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "processors._window",
    .m_doc = "The node stage's hot path: device windows, scrapes into them, and a job's span of one.",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__window(void) {
    EMPTY_STR = PyUnicode_FromString("");
    if (EMPTY_STR == NULL || PyType_Ready(&WindowType) < 0 || PyType_Ready(&ReaderType) < 0 ||
        PyType_Ready(&ScrapeType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "DeviceWindow", (PyObject *)&WindowType) < 0 ||
        PyModule_AddObjectRef(m, "ScrapeReader", (PyObject *)&ReaderType) < 0 ||
        PyModule_AddObjectRef(m, "Scrape", (PyObject *)&ScrapeType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
