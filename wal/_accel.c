/* wal._accel: optional C accelerator for the WAL's per-record frame path.
 *
 * One call does what Wal.append's Python does per record for a plain frame of format
 * version 2/3 (wal/format.py): pack the head (and, for the CRC, the previous frame's
 * check in front of it), chain the CRC32C (v = crc32c(pre + payload, prev_v);
 * m = mix(v)), and write head + payload + check with ONE write/writev. It returns
 * (v, m, written); Python keeps every piece of state (LSN, chain, segment size) and
 * finishes a short or failed write with its own path, exactly as for os.write.
 *
 * The on-disk format is unchanged: tests/wal/test_accel.py checks that segment files
 * written with and without this module are byte-identical.
 *
 * CRC32C: csrc/ferry_crc32c.h (shared with checkpoint/_pageaccel.c): SSE4.2 when the
 * CPU has it, checked at run time, a slicing-by-8 table otherwise. Results equal the
 * `crc32c` package's crc32c(data, value).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#define HEAD_SIZE 16               /* length u32 | lsn u64 | type u16 | flags u16 */
#define CHECK_SIZE 4
#define COPY_MAX 8192              /* payloads up to this are copied next to the head */
/* Write without the GIL from this frame size on. Releasing and taking back the GIL
 * cost 0.2-0.3 us of a ~5 us 4 KiB write here (single appender, A/B of builds), and a
 * thread waiting for the GIL meanwhile can make the appender wait a switch interval to
 * get it back; from 64 KiB (a write of 30 us or more) other threads gain real time. */
#define NOGIL_MIN 65536

/* ---------------------------------------------------------------- CRC32C */
/* The one implementation of Ferry's C accelerators (csrc/ferry_crc32c.h). */
#include "ferry_crc32c.h"
#define crc_update ferry_crc_update
#define use_hw ferry_crc_use_hw
#define hw_available ferry_crc_hw_available

static size_t write_cap = 0;   /* test hook (_set_write_cap): at most this many bytes per write */

/* ---------------------------------------------------------------- helpers */
static inline void put_u16(unsigned char *p, uint32_t x) {
    p[0] = (unsigned char)x;
    p[1] = (unsigned char)(x >> 8);
}

static inline void put_u32(unsigned char *p, uint32_t x) {
    p[0] = (unsigned char)x;
    p[1] = (unsigned char)(x >> 8);
    p[2] = (unsigned char)(x >> 16);
    p[3] = (unsigned char)(x >> 24);
}

static inline void put_u64(unsigned char *p, uint64_t x) {
    put_u32(p, (uint32_t)x);
    put_u32(p + 4, (uint32_t)(x >> 32));
}

static inline uint32_t mix(uint32_t v) {
    uint32_t h = v >> 16;
    return (((h ^ v) & 0xFFFFu) << 16) | h;
}

/* A Python int in [lo, hi] (as uint64), or -1 with ValueError/TypeError set. */
static int get_range(PyObject *o, const char *what, int64_t lo, uint64_t hi,
                     uint64_t *out) {
    int overflow = 0;
    long long x;
    if (PyLong_Check(o)) {
        x = PyLong_AsLongLongAndOverflow(o, &overflow);
    } else {                       /* what struct.pack accepts: __index__ */
        PyObject *i = PyNumber_Index(o);
        if (i == NULL)
            return -1;
        int r = get_range(i, what, lo, hi, out);
        Py_DECREF(i);
        return r;
    }
    if (overflow > 0) {
        unsigned long long u = PyLong_AsUnsignedLongLong(o);
        if (u == (unsigned long long)-1 && PyErr_Occurred()) {
            if (!PyErr_ExceptionMatches(PyExc_OverflowError))
                return -1;
            PyErr_Clear();
            goto bad;
        }
        if (u > hi)
            goto bad;
        *out = u;
        return 0;
    }
    if (x == -1 && PyErr_Occurred())
        return -1;
    if (overflow < 0 || x < lo || (x >= 0 && (uint64_t)x > hi))
        goto bad;
    *out = (uint64_t)x;
    return 0;
bad:
    if (strcmp(what, "type") == 0)       /* the message of wal.format.check_type */
        PyErr_Format(PyExc_ValueError, "record type must be in 0..65535, got %R", o);
    else
        PyErr_Format(PyExc_ValueError, "%s out of range: %R", what, o);
    return -1;
}

/* ---------------------------------------------------------------- the frame */
/* Pack, CRC and write one plain frame of payload p[0:n]. On return *nv, *nm are the new
 * chain pair and *written the bytes written (flen when whole; fewer, 0 on an error
 * other than EINTR, when the caller must finish the frame). -1 with an exception set
 * only when a signal handler raised (nothing written). */
static int write_frame(int fd, const unsigned char *p, size_t n, uint32_t type,
                       uint64_t lsn, uint32_t v, long long m, uint32_t *nv, uint32_t *nm,
                       Py_ssize_t *written) {
    size_t flen = HEAD_SIZE + n + CHECK_SIZE;
    /* small[0:4] = previous check (CRC only), small[4:20] = head, then the payload
     * (copied when small), then the new check. */
    unsigned char small[CHECK_SIZE + HEAD_SIZE + COPY_MAX + CHECK_SIZE];
    unsigned char *head = small + CHECK_SIZE;
    put_u32(head, (uint32_t)n);
    put_u64(head + 4, lsn);
    put_u16(head + 12, type);
    put_u16(head + 14, 0);
    uint32_t crc = ~v;
    if (m >= 0) {
        put_u32(small, (uint32_t)m);
        crc = crc_update(crc, small, CHECK_SIZE + HEAD_SIZE);
    } else {
        crc = crc_update(crc, head, HEAD_SIZE);
    }
    int copy = n <= COPY_MAX;
    unsigned char checkbuf[CHECK_SIZE];
    unsigned char *check = copy ? head + HEAD_SIZE + n : checkbuf;
    if (copy && n)
        memcpy(head + HEAD_SIZE, p, n);
    crc = crc_update(crc, copy ? head + HEAD_SIZE : p, n);
    *nv = ~crc;
    *nm = mix(*nv);
    put_u32(check, *nm);

    struct iovec iov[3];
    iov[0].iov_base = head;
    iov[0].iov_len = HEAD_SIZE;
    iov[1].iov_base = (void *)p;
    iov[1].iov_len = n;
    iov[2].iov_base = check;
    iov[2].iov_len = CHECK_SIZE;
    int iovcnt = 3;
    size_t wlen = flen;
    if (write_cap && write_cap < flen) {   /* test hook: a short write, as ENOSPC makes */
        wlen = write_cap;
        size_t left = wlen;
        for (iovcnt = 0; left; iovcnt++) {
            if (iov[iovcnt].iov_len > left)
                iov[iovcnt].iov_len = left;
            left -= iov[iovcnt].iov_len;
        }
    }
    ssize_t r;
    for (;;) {
        int err;
        if (flen >= NOGIL_MIN) {
            Py_BEGIN_ALLOW_THREADS
            r = copy ? write(fd, head, wlen) : writev(fd, iov, iovcnt);
            err = errno;
            Py_END_ALLOW_THREADS
        } else {
            r = copy ? write(fd, head, wlen) : writev(fd, iov, iovcnt);
            err = errno;
        }
        if (r >= 0)
            break;
        if (err != EINTR) {
            r = 0;         /* Python's write path tries again and reports the error */
            break;
        }
        if (PyErr_CheckSignals() < 0)      /* a handler raised: nothing was written */
            return -1;
    }
    *written = (Py_ssize_t)r;
    return 0;
}

/* The payload's bytes (contiguous, 1-byte items: len() of the object is its byte
 * count, which the Python around the call relies on); ValueError above the u32 length
 * field. */
static int get_payload(PyObject *o, Py_buffer *buf) {
    if (PyObject_GetBuffer(o, buf, PyBUF_ND | PyBUF_FORMAT) < 0)
        return -1;
    if (buf->itemsize != 1) {
        PyBuffer_Release(buf);
        PyErr_Format(PyExc_ValueError, "payload must have 1-byte items (got a buffer of "
                     "%zd-byte items; pass bytes, or memoryview.cast('B'))", buf->itemsize);
        return -1;
    }
    if ((size_t)buf->len > 0xFFFFFFFFu) {
        PyBuffer_Release(buf);
        PyErr_SetString(PyExc_ValueError, "payload above 4 GiB - 1");
        return -1;
    }
    return 0;
}

static int get_fd(PyObject *o, int *fd) {
    long x = PyLong_AsLong(o);
    if (x == -1 && PyErr_Occurred())
        return -1;
    if (x < 0 || x > INT_MAX) {
        PyErr_SetString(PyExc_ValueError, "bad file descriptor");
        return -1;
    }
    *fd = (int)x;
    return 0;
}

static int get_m(PyObject *o, long long *m) {
    *m = PyLong_AsLongLong(o);
    if (*m == -1 && PyErr_Occurred())
        return -1;
    if (*m < -1 || *m > 0xFFFFFFFFLL) {
        PyErr_SetString(PyExc_ValueError, "m out of range");
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(frame_write_doc,
"frame_write(fd, payload, type, lsn, v, m) -> (v, m, written)\n\n"
"Write one plain frame (format v2/v3) of `payload` to `fd` with one write/writev.\n"
"`v`, `m`: the chain as Wal keeps it (m = -1: no check pending). Returns the new\n"
"(v, m) and the bytes written: 16 + len(payload) + 4 when whole; fewer (0 on an\n"
"error other than EINTR, which is retried) when the caller must finish the frame.\n"
"Raises only for bad arguments or a signal handler's exception (nothing written).");

static PyObject *frame_write(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "frame_write takes 6 arguments");
        return NULL;
    }
    int fd;
    uint64_t type, lsn, v;
    long long m;
    if (get_fd(args[0], &fd) < 0 ||
        get_range(args[2], "type", 0, 0xFFFF, &type) < 0 ||
        get_range(args[3], "lsn", 0, UINT64_MAX, &lsn) < 0 ||
        get_range(args[4], "v", 0, 0xFFFFFFFFu, &v) < 0 || get_m(args[5], &m) < 0)
        return NULL;
    Py_buffer buf;
    if (get_payload(args[1], &buf) < 0)
        return NULL;
    uint32_t nv, nm;
    Py_ssize_t written;
    int rc = write_frame(fd, buf.buf, (size_t)buf.len, (uint32_t)type, lsn, (uint32_t)v, m,
                         &nv, &nm, &written);
    PyBuffer_Release(&buf);
    if (rc < 0)
        return NULL;
    PyObject *t = PyTuple_New(3);
    if (t == NULL)
        return NULL;
    PyObject *a = PyLong_FromUnsignedLong(nv), *b = PyLong_FromUnsignedLong(nm),
             *c = PyLong_FromSsize_t(written);
    if (a == NULL || b == NULL || c == NULL) {
        Py_XDECREF(a);
        Py_XDECREF(b);
        Py_XDECREF(c);
        Py_DECREF(t);
        return NULL;
    }
    PyTuple_SET_ITEM(t, 0, a);
    PyTuple_SET_ITEM(t, 1, b);
    PyTuple_SET_ITEM(t, 2, c);
    return t;
}

/* ---------------------------------------------------------------- crc32c & hooks */
PyDoc_STRVAR(crc32c_doc,
"crc32c(data, value=0) -> int\n\nCRC32C of `data` chained from `value`, as the\n"
"`crc32c` package computes it (for tests and tools).");

static PyObject *py_crc32c(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "crc32c(data, value=0)");
        return NULL;
    }
    uint64_t value = 0;
    if (nargs == 2 && get_range(args[1], "value", 0, 0xFFFFFFFFu, &value) < 0)
        return NULL;
    Py_buffer buf;
    if (PyObject_GetBuffer(args[0], &buf, PyBUF_SIMPLE) < 0)
        return NULL;
    uint32_t crc = ~crc_update(~(uint32_t)value, buf.buf, (size_t)buf.len);
    PyBuffer_Release(&buf);
    return PyLong_FromUnsignedLong(crc);
}

PyDoc_STRVAR(set_hardware_doc,
"_set_hardware(on) -> bool\n\nTest hook: use the SSE4.2 CRC (when the CPU has it) or\n"
"force the table-driven one. Returns whether the hardware path is now in use.");

static PyObject *set_hardware(PyObject *self, PyObject *arg) {
    int on = PyObject_IsTrue(arg);
    if (on < 0)
        return NULL;
    use_hw = on && hw_available;
    return PyBool_FromLong(use_hw);
}

static PyObject *set_write_cap(PyObject *self, PyObject *arg) {
    Py_ssize_t cap = PyLong_AsSsize_t(arg);
    if (cap == -1 && PyErr_Occurred())
        return NULL;
    write_cap = cap > 0 ? (size_t)cap : 0;
    Py_RETURN_NONE;
}

static PyObject *hardware(PyObject *self, PyObject *unused) {
    return PyBool_FromLong(use_hw);
}

static PyMethodDef methods[] = {
    {"frame_write", (PyCFunction)(void (*)(void))frame_write, METH_FASTCALL, frame_write_doc},
    {"crc32c", (PyCFunction)(void (*)(void))py_crc32c, METH_FASTCALL, crc32c_doc},
    {"_set_hardware", set_hardware, METH_O, set_hardware_doc},
    {"_set_write_cap", set_write_cap, METH_O,
     "Test hook: write at most N bytes per frame write (0: whole frames), as a full disk "
     "or a signal can cut a write short."},
    {"hardware", hardware, METH_NOARGS, "True when the SSE4.2 CRC32C path is in use."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "wal._accel",
    "C accelerator for the WAL's per-record frame path (see wal/_accel.c).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__accel(void) {
    ferry_crc_init();
    PyObject *mod = PyModule_Create(&module);
    if (mod == NULL)
        return NULL;
    if (PyModule_AddIntConstant(mod, "COPY_MAX", COPY_MAX) < 0 ||
        PyModule_AddIntConstant(mod, "NOGIL_MIN", NOGIL_MIN) < 0) {
        Py_DECREF(mod);
        return NULL;
    }
    return mod;
}
