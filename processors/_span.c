/* One pass over seconds [i0, i1) of a device window's arrays (processors/windows.py: DeviceWindow), for
 * processors/rollup.py's span_row. NaN marks a metric absent in a second; `seen` marks a second sampled.
 * Sums run left to right, second by second, as rollup's plain_sum does on the general path, so both paths
 * give the same bytes. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

static int get(PyObject *obj, Py_buffer *view, Py_ssize_t itemsize, Py_ssize_t need, const char *what) {
    if (PyObject_GetBuffer(obj, view, PyBUF_SIMPLE) < 0)
        return -1;
    if (view->len < need * itemsize) {
        PyErr_Format(PyExc_ValueError, "%s holds %zd bytes, %zd needed", what, view->len, need * itemsize);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

static PyObject *or_none(int have, double v) {
    if (!have)
        Py_RETURN_NONE;
    return PyFloat_FromDouble(v);
}

/* span_stats(act, fb, pw, seen, i0, i1) -> (n_seen, n_act, total, max_act, max_fb_act, max_fb, pw_total, n_pw):
 * the seconds sampled; those with an activity, its sum and max; the largest framebuffer use among the
 * seconds with an activity and among all sampled ones; the power sum and how many seconds have one. */
static PyObject *span_stats(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "span_stats(act, fb, pw, seen, i0, i1)");
        return NULL;
    }
    Py_ssize_t i0 = PyLong_AsSsize_t(args[4]), i1 = PyLong_AsSsize_t(args[5]);
    if ((i0 == -1 || i1 == -1) && PyErr_Occurred())
        return NULL;
    if (i0 < 0 || i1 < i0) {
        PyErr_SetString(PyExc_ValueError, "need 0 <= i0 <= i1");
        return NULL;
    }
    Py_buffer va, vf, vp, vs;
    if (get(args[0], &va, sizeof(double), i1, "act") < 0)
        return NULL;
    if (get(args[1], &vf, sizeof(double), i1, "fb") < 0)
        goto release_a;
    if (get(args[2], &vp, sizeof(double), i1, "pw") < 0)
        goto release_f;
    if (get(args[3], &vs, 1, i1, "seen") < 0)
        goto release_p;
    const double *act = va.buf, *fb = vf.buf, *pw = vp.buf;
    const unsigned char *seen = vs.buf;
    Py_ssize_t n_seen = 0, n_act = 0, n_pw = 0;
    double total = 0.0, max_act = 0.0, max_fb_act = 0.0, max_fb = 0.0, pw_total = 0.0;
    int have_fb_act = 0, have_fb = 0;
    for (Py_ssize_t i = i0; i < i1; i++) {
        if (!seen[i])
            continue;
        n_seen++;
        double a = act[i], f = fb[i], p = pw[i];
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
    PyBuffer_Release(&vs);
    PyBuffer_Release(&vp);
    PyBuffer_Release(&vf);
    PyBuffer_Release(&va);
    return Py_BuildValue("(nndNNNdn)", n_seen, n_act, total, or_none(n_act > 0, max_act),
                         or_none(have_fb_act, max_fb_act), or_none(have_fb, max_fb), pw_total, n_pw);
release_p:
    PyBuffer_Release(&vp);
release_f:
    PyBuffer_Release(&vf);
release_a:
    PyBuffer_Release(&va);
    return NULL;
}

static PyMethodDef methods[] = {
    {"span_stats", (PyCFunction)(void (*)(void))span_stats, METH_FASTCALL,
     "span_stats(act, fb, pw, seen, i0, i1) -> (n_seen, n_act, total, max_act, max_fb_act, max_fb, pw_total, n_pw)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "processors._span",
    .m_doc = "One pass over a device window's seconds for the minute close.",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__span(void) { return PyModule_Create(&module); }
