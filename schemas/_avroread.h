/* Bounds-checked reading of Avro binary values from untrusted bytes: the one implementation behind
 * schemas/_leanavro.c (decoding along a plan) and processors/_window.c (a scrape into its windows).
 *
 * A varint is at most 10 bytes and 64 bits, a length is never negative nor past the end. A value that
 * does not read raises the reader's error class (MalformedRecord), naming the body (`label`), its size
 * and the byte where it went wrong, and the function returns -1.
 */
#ifndef GPULEDGER_AVROREAD_H
#define GPULEDGER_AVROREAD_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

typedef struct {
    const unsigned char *d;
    Py_ssize_t end;
    Py_ssize_t pos;
    PyObject *error; /* borrowed: the exception class raised for bytes that do not read */
    PyObject *label; /* borrowed: what the messages call the body ("scrape body") */
} AvroReader;

/* A reader over `(data: bytes, pos: int)`, a method's two arguments; `usage` names them in the TypeError. */
static int avro_reader_from_args(PyObject *const *args, Py_ssize_t nargs, const char *usage, PyObject *error,
                                 PyObject *label, AvroReader *r) {
    if (nargs != 2 || !PyBytes_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, usage);
        return -1;
    }
    Py_ssize_t pos = PyLong_AsSsize_t(args[1]);
    if (pos == -1 && PyErr_Occurred())
        return -1;
    *r = (AvroReader){(const unsigned char *)PyBytes_AS_STRING(args[0]), PyBytes_GET_SIZE(args[0]), pos, error, label};
    if (pos < 0 || pos > r->end) {
        PyErr_SetString(PyExc_ValueError, "pos outside the data");
        return -1;
    }
    return 0;
}

static void avro_fail(AvroReader *r, const char *why, Py_ssize_t at) {
    PyErr_Format(r->error, "%U does not decode (%zd bytes): %s at byte %zd", r->label, r->end, why, at);
}

/* `avro_fail` naming the number read (a count or a length) that cannot be right. */
static void avro_fail_number(AvroReader *r, const char *what, int64_t n, Py_ssize_t at) {
    PyErr_Format(r->error, "%U does not decode (%zd bytes): %s %lld at byte %zd of %zd", r->label, r->end, what,
                 (long long)n, at, r->end);
}

static int avro_read_long(AvroReader *r, int64_t *out) {
    uint64_t n = 0;
    int shift = 0;
    for (;;) {
        if (r->pos >= r->end) {
            avro_fail(r, "truncated varint", r->pos);
            return -1;
        }
        unsigned b = r->d[r->pos++];
        if (shift == 63 && (b & 0x7e)) {
            avro_fail(r, "varint beyond 64 bits", r->pos - 1);
            return -1;
        }
        n |= (uint64_t)(b & 0x7f) << shift;
        if (b < 0x80)
            break;
        shift += 7;
        if (shift > 63) {
            avro_fail(r, "varint longer than 10 bytes", r->pos);
            return -1;
        }
    }
    *out = (int64_t)((n >> 1) ^ (~(n & 1) + 1));
    return 0;
}

static int avro_read_double(AvroReader *r, double *out) {
    if (r->end - r->pos < 8) {
        avro_fail(r, "truncated double", r->pos);
        return -1;
    }
    uint64_t bits = 0;
    for (int i = 7; i >= 0; i--)
        bits = (bits << 8) | r->d[r->pos + i];
    memcpy(out, &bits, sizeof bits);
    r->pos += 8;
    return 0;
}

/* A string's bytes: `*at` their start, `*len` their count (not yet checked as UTF-8). */
static int avro_read_string(AvroReader *r, Py_ssize_t *at, Py_ssize_t *len) {
    int64_t n;
    if (avro_read_long(r, &n) < 0)
        return -1;
    if (n < 0 || n > r->end - r->pos) {
        avro_fail_number(r, "string length", n, r->pos);
        return -1;
    }
    *at = r->pos;
    *len = (Py_ssize_t)n;
    r->pos += (Py_ssize_t)n;
    return 0;
}

/* The branch of a [null, X] union: 0 for null, 1 for X. */
static int avro_read_optional(AvroReader *r, int *present) {
    if (r->pos >= r->end) {
        avro_fail(r, "truncated union index", r->pos);
        return -1;
    }
    unsigned tag = r->d[r->pos++];
    if (tag != 0 && tag != 2) {
        avro_fail(r, "bad union index byte", r->pos - 1);
        return -1;
    }
    *present = tag == 2;
    return 0;
}

/* An array block's header: `*count` items (0 ends the array). A negative count's byte size is read and
 * checked; `item_min` is the fewest bytes an item takes, so a count the bytes left cannot hold is refused
 * before any item is read. */
static int avro_read_block(AvroReader *r, Py_ssize_t item_min, int64_t *count) {
    int64_t n;
    if (avro_read_long(r, &n) < 0)
        return -1;
    if (n < 0) {
        int64_t size;
        if (n == INT64_MIN) {
            avro_fail(r, "array block count out of range", r->pos);
            return -1;
        }
        n = -n;
        if (avro_read_long(r, &size) < 0)
            return -1;
        if (size < 0 || size > r->end - r->pos) {
            avro_fail_number(r, "array block size past the end:", size, r->pos);
            return -1;
        }
    }
    if (n > (r->end - r->pos) / item_min) {
        PyErr_Format(r->error,
                     "%U does not decode (%zd bytes): %lld array items at byte %zd cannot fit in the %zd bytes left",
                     r->label, r->end, (long long)n, r->pos, r->end - r->pos);
        return -1;
    }
    *count = n;
    return 0;
}

#endif
