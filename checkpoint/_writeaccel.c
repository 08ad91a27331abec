/* checkpoint._writeaccel: the page WRITE path's byte work, in C.
 *
 * An optional accelerator of checkpoint/page.py (the page format is documented in
 * checkpoint/pagefile.py and docs/formats.md). It builds the page images an update
 * writes - the pages of a value's overflow chain, in one call, new empty pages, and the
 * slotted insert / delete / compaction of a DATA page - and nothing else: partition state,
 * page memory bookkeeping, undo images, locks and every decision stay in Python
 * (checkpoint/partition.py), which calls these through page.py. Each function makes
 * exactly the bytes of its Python twin in page.py (tests/checkpoint/test_writeaccel.py
 * compares them on random workloads).
 *
 * Bad input (a wrong buffer type or size, a page whose header or slots do not fit
 * it, an index out of range) raises TypeError/ValueError/IndexError BEFORE any byte
 * of the page changes, except one case: ``insert`` told of more free bytes than the
 * page has, found after a compaction (which keeps the page valid: same entries, same
 * slots); the Python twin would write over the slot directory there. Nothing here
 * reads or writes outside the buffers it was given.
 *
 * Every call holds the GIL throughout (no Python code runs in the middle): the one
 * static scratch page below is therefore never shared.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define ABI_VERSION 1      /* page.py refuses a module built from another version */
/* The page layout comes from csrc/ferry_page_layout.h, generated from
 * checkpoint/layout.py (the one definition): short names for its numbers. */
#include "ferry_page_layout.h"
#define HDR FERRY_PG_HDR
#define ENTRY_SIZE FERRY_PG_ENTRY
#define SLOT FERRY_PG_SLOT
#define T_DATA FERRY_PG_T_DATA
#define T_OVF FERRY_PG_T_OVERFLOW
#define F_OVF FERRY_PG_F_OVERFLOW
#define PTR_SIZE FERRY_PG_PTR
#define MIN_PAGE 64        /* smallest buffer taken as a page (the format's is 1 KiB) */
#define MAX_PAGE FERRY_PG_MAX_PAGE   /* slot offsets are u16: the format's largest page */

static inline uint32_t rd16(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8; }
static inline uint32_t rd32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline void wr16(uint8_t *p, uint32_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); }
static inline void wr32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); p[2] = (uint8_t)(v >> 16); p[3] = (uint8_t)(v >> 24);
}
static inline void wr64(uint8_t *p, uint64_t v)
{
    wr32(p, (uint32_t)v);
    wr32(p + 4, (uint32_t)(v >> 32));
}

static uint8_t scratch[MAX_PAGE];   /* compaction's copy of the page (GIL held) */

/* -- argument helpers ---------------------------------------------------------------- */

/* The page as a writable buffer of MIN_PAGE..MAX_PAGE bytes. */
static int page_buffer(PyObject *o, Py_buffer *b, const char *fn)
{
    if (PyObject_GetBuffer(o, b, PyBUF_WRITABLE) < 0) {
        PyErr_Format(PyExc_TypeError, "%s: the page must be a writable buffer (a bytearray), "
                     "not %.100s", fn, Py_TYPE(o)->tp_name);
        return -1;
    }
    if (b->len < MIN_PAGE || b->len > MAX_PAGE) {
        PyErr_Format(PyExc_ValueError, "%s: a page of %zd bytes (pages are %d..%d bytes)",
                     fn, b->len, MIN_PAGE, MAX_PAGE);
        PyBuffer_Release(b);
        return -1;
    }
    return 0;
}

/* A Python int in [0, max] (bool and IntEnum/IntFlag members are ints too). */
static int uint_arg(PyObject *o, uint64_t max, uint64_t *out, const char *fn, const char *what)
{
    if (!PyLong_Check(o)) {
        PyErr_Format(PyExc_TypeError, "%s: %s must be an int, not %.100s", fn, what,
                     Py_TYPE(o)->tp_name);
        return -1;
    }
    int overflow;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (v == -1 && PyErr_Occurred())
        return -1;
    unsigned long long u;
    if (overflow > 0) {                      /* above LLONG_MAX: maybe still a u64 */
        u = PyLong_AsUnsignedLongLong(o);
        if (u == (unsigned long long)-1 && PyErr_Occurred()) {
            PyErr_Clear();
            goto range;
        }
    }
    else if (overflow < 0 || v < 0)
        goto range;
    else
        u = (unsigned long long)v;
    if (u > max)
        goto range;
    *out = u;
    return 0;
range:
    PyErr_Format(PyExc_ValueError, "%s: %s %R out of range 0..%llu", fn, what, o,
                 (unsigned long long)max);
    return -1;
}

/* The header of a DATA page (count, heap start) when they fit the page. */
static int data_header(const uint8_t *pg, Py_ssize_t len, uint32_t *count, uint32_t *heap,
                       const char *fn)
{
    if (pg[FERRY_PG_OFF_TYPE] != T_DATA) {
        PyErr_Format(PyExc_ValueError, "%s: page type %u is not DATA (%d)", fn, pg[FERRY_PG_OFF_TYPE], T_DATA);
        return -1;
    }
    *count = rd16(pg + FERRY_PG_OFF_COUNT);
    *heap = rd32(pg + FERRY_PG_OFF_AUX);
    if (!((uint64_t)HDR + SLOT * (uint64_t)*count <= *heap && *heap <= (uint64_t)len)) {
        PyErr_Format(PyExc_ValueError, "%s: DATA page header (%u slots, heap start %u) does "
                     "not fit a %zd-byte page", fn, *count, *heap, len);
        return -1;
    }
    return 0;
}

/* Bytes of the entry at ``off`` (0 when it does not lie inside the page past the
 * slot directory ``dir_end``). */
static uint32_t entry_bytes(const uint8_t *pg, Py_ssize_t len, uint32_t off, uint32_t dir_end)
{
    if (off < dir_end || (uint64_t)off + ENTRY_SIZE > (uint64_t)len)
        return 0;
    const uint8_t *e = pg + off;
    uint64_t size = ENTRY_SIZE + (uint64_t)rd16(e + FERRY_PG_E_KEY_LEN) + (e[FERRY_PG_E_FLAGS] & F_OVF ? PTR_SIZE : rd32(e + FERRY_PG_E_VALUE_LEN));
    if ((uint64_t)off + size > (uint64_t)len)
        return 0;
    return (uint32_t)size;
}

/* -- compaction (page.compact) ------------------------------------------------------- */

/* Pack the live entries at the end of the page in slot order, slots keep their
 * numbers, zero the gap after the directory; the new heap start. -1 with ValueError
 * (page unchanged) when an entry lies outside the page or the entries cannot fit. */
static long compact_page(uint8_t *pg, Py_ssize_t len, uint32_t count, const char *fn)
{
    uint32_t dir_end = HDR + SLOT * count;
    uint64_t total = 0;
    for (uint32_t s = 0; s < count; s++) {
        uint32_t off = rd16(pg + HDR + SLOT * s);
        if (!off)
            continue;
        uint32_t size = entry_bytes(pg, len, off, dir_end);
        if (!size) {
            PyErr_Format(PyExc_ValueError, "%s: slot %u points to an entry outside the page "
                         "(offset %u)", fn, s, off);
            return -1;
        }
        total += size;
    }
    if (dir_end + total > (uint64_t)len) {
        PyErr_Format(PyExc_ValueError, "%s: the live entries (%llu bytes) overlap: they do "
                     "not fit the page", fn, (unsigned long long)total);
        return -1;
    }
    memcpy(scratch, pg, (size_t)len);
    uint32_t heap = (uint32_t)len;
    for (uint32_t s = 0; s < count; s++) {
        uint32_t off = rd16(scratch + HDR + SLOT * s);
        if (!off)
            continue;
        uint32_t size = entry_bytes(scratch, len, off, dir_end);
        heap -= size;
        memcpy(pg + heap, scratch + off, size);
        wr16(pg + HDR + SLOT * s, heap);
    }
    memset(pg + dir_end, 0, heap - dir_end);
    wr32(pg + FERRY_PG_OFF_AUX, heap);
    return (long)heap;
}

static PyObject *py_compact(PyObject *self, PyObject *arg)
{
    /* compact(buf) -> new heap start (page.compact) */
    Py_buffer b;
    if (page_buffer(arg, &b, "compact") < 0)
        return NULL;
    uint32_t count, heap;
    long r = -1;
    if (data_header(b.buf, b.len, &count, &heap, "compact") == 0)
        r = compact_page(b.buf, b.len, count, "compact");
    PyBuffer_Release(&b);
    return r < 0 ? NULL : PyLong_FromLong(r);
}

/* -- insert (page.insert) ------------------------------------------------------------ */

static PyObject *py_insert(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    /* insert(buf, free, flags, key, counter, vlen, stored) -> (slot, bytes used) | None */
    if (nargs != 7) {
        PyErr_Format(PyExc_TypeError, "insert takes 7 arguments (buf, free, flags, key, "
                     "counter, value_len, stored), got %zd", nargs);
        return NULL;
    }
    Py_ssize_t free_ = PyLong_AsSsize_t(args[1]);
    if (free_ == -1 && PyErr_Occurred())
        return NULL;
    uint64_t flags, counter, vlen;
    if (uint_arg(args[2], 255, &flags, "insert", "flags") < 0 ||
        uint_arg(args[4], UINT64_MAX, &counter, "insert", "counter") < 0 ||
        uint_arg(args[5], UINT32_MAX, &vlen, "insert", "value_len") < 0)
        return NULL;
    Py_buffer b, kb, sb;
    if (page_buffer(args[0], &b, "insert") < 0)
        return NULL;
    if (PyObject_GetBuffer(args[3], &kb, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&b);
        return NULL;
    }
    if (PyObject_GetBuffer(args[6], &sb, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&kb);
        PyBuffer_Release(&b);
        return NULL;
    }
    PyObject *result = NULL;
    uint8_t *pg = b.buf;
    Py_ssize_t len = b.len;
    uint32_t count, heap;
    if (data_header(pg, len, &count, &heap, "insert") < 0)
        goto done;
    Py_ssize_t size = ENTRY_SIZE + kb.len + sb.len;
    long slot = -1;
    for (uint32_t s = 0; s < count; s++)
        if (rd16(pg + HDR + SLOT * s) == 0) {
            slot = (long)s;
            break;
        }
    Py_ssize_t need = size + (slot < 0 ? SLOT : 0);
    if (need > free_) {                 /* no room: None, as page.insert (checked first) */
        result = Py_None;
        Py_INCREF(result);
        goto done;
    }
    /* the caller says it fits: what cannot be written is an error, not an overwrite */
    if (kb.len > 0xFFFF) {
        PyErr_Format(PyExc_ValueError, "insert: key of %zd bytes (key_len is u16)", kb.len);
        goto done;
    }
    if (size > len - HDR) {
        PyErr_Format(PyExc_ValueError, "insert: an entry of %zd bytes cannot fit a %zd-byte "
                     "page", size, len);
        goto done;
    }
    if (slot < 0 && count >= 0xFFFF) {
        PyErr_SetString(PyExc_ValueError, "insert: the slot directory is full (65535 slots)");
        goto done;
    }
    Py_ssize_t dir_end = HDR + SLOT * ((Py_ssize_t)count + (slot < 0));
    if ((Py_ssize_t)heap - dir_end < size) {
        long h = compact_page(pg, len, count, "insert");
        if (h < 0)
            goto done;
        heap = (uint32_t)h;
        if ((Py_ssize_t)heap - dir_end < size) {
            PyErr_Format(PyExc_ValueError, "insert: told %zd bytes are free, but the page has "
                         "room for %zd after compaction (the caller's free-space map is wrong)",
                         free_, (Py_ssize_t)heap - dir_end);
            goto done;
        }
    }
    uint32_t off = heap - (uint32_t)size;
    uint8_t *e = pg + off;
    e[FERRY_PG_E_FLAGS] = (uint8_t)flags;
    wr16(e + FERRY_PG_E_KEY_LEN, (uint32_t)kb.len);
    wr32(e + FERRY_PG_E_VALUE_LEN, (uint32_t)vlen);
    wr64(e + FERRY_PG_E_COUNTER, counter);
    memcpy(e + ENTRY_SIZE, kb.buf, (size_t)kb.len);
    memcpy(e + ENTRY_SIZE + kb.len, sb.buf, (size_t)sb.len);
    if (slot < 0) {
        slot = (long)count;
        wr16(pg + FERRY_PG_OFF_COUNT, count + 1);
    }
    wr16(pg + HDR + SLOT * slot, off);
    wr32(pg + FERRY_PG_OFF_AUX, off);
    result = Py_BuildValue("(ln)", slot, need);
done:
    PyBuffer_Release(&sb);
    PyBuffer_Release(&kb);
    PyBuffer_Release(&b);
    return result;
}

/* -- delete / read_entry ---------------------------------------------------------------- */

/* The live slot ``s`` of a DATA page (IndexError / ValueError otherwise). */
static int live_slot(const uint8_t *pg, Py_ssize_t len, PyObject *slot_obj, uint32_t *slot,
                     uint32_t *off, const char *fn)
{
    uint32_t count, heap;
    uint64_t s;
    if (uint_arg(slot_obj, 0xFFFF, &s, fn, "slot") < 0 ||
        data_header(pg, len, &count, &heap, fn) < 0)
        return -1;
    if (s >= count) {
        PyErr_Format(PyExc_IndexError, "%s: slot %llu of a page with %u slots", fn,
                     (unsigned long long)s, count);
        return -1;
    }
    *slot = (uint32_t)s;
    *off = rd16(pg + HDR + SLOT * s);
    if (!*off) {
        PyErr_Format(PyExc_ValueError, "%s: slot %u is empty", fn, *slot);
        return -1;
    }
    return 0;
}

static PyObject *py_delete(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    /* delete(buf, slot, size) -> bytes that became reusable (page.delete) */
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "delete takes 3 arguments (buf, slot, size), got %zd", nargs);
        return NULL;
    }
    Py_ssize_t size = PyLong_AsSsize_t(args[2]);
    if (size == -1 && PyErr_Occurred())
        return NULL;
    Py_buffer b;
    if (page_buffer(args[0], &b, "delete") < 0)
        return NULL;
    uint8_t *pg = b.buf;
    uint32_t slot, off;
    if (live_slot(pg, b.len, args[1], &slot, &off, "delete") < 0) {
        PyBuffer_Release(&b);
        return NULL;
    }
    uint32_t count = rd16(pg + FERRY_PG_OFF_COUNT);
    Py_ssize_t freed = size;
    wr16(pg + HDR + SLOT * slot, 0);
    if (slot == count - 1) {            /* trim trailing empty slots: the directory shrinks */
        while (count && rd16(pg + HDR + SLOT * (count - 1)) == 0) {
            count--;
            freed += SLOT;
        }
        wr16(pg + FERRY_PG_OFF_COUNT, count);
    }
    PyBuffer_Release(&b);
    return PyLong_FromSsize_t(freed);
}

static PyObject *py_read_entry(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    /* read_entry(buf, slot) -> (flags, counter, value_len, value_offset or first
     * overflow page, entry size) (page.read_entry) */
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "read_entry takes 2 arguments (buf, slot), got %zd", nargs);
        return NULL;
    }
    Py_buffer b;
    if (PyObject_GetBuffer(args[0], &b, PyBUF_SIMPLE) < 0)
        return NULL;
    PyObject *result = NULL;
    const uint8_t *pg = b.buf;
    uint32_t slot, off, size;
    if (b.len < MIN_PAGE || b.len > MAX_PAGE) {
        PyErr_Format(PyExc_ValueError, "read_entry: a page of %zd bytes (pages are %d..%d "
                     "bytes)", b.len, MIN_PAGE, MAX_PAGE);
        goto done;
    }
    if (live_slot(pg, b.len, args[1], &slot, &off, "read_entry") < 0)
        goto done;
    size = entry_bytes(pg, b.len, off, HDR + SLOT * rd16(pg + FERRY_PG_OFF_COUNT));
    if (!size) {
        PyErr_Format(PyExc_ValueError, "read_entry: slot %u points to an entry outside the "
                     "page (offset %u)", slot, off);
        goto done;
    }
    const uint8_t *e = pg + off;
    uint32_t flags = e[FERRY_PG_E_FLAGS], klen = rd16(e + FERRY_PG_E_KEY_LEN), vlen = rd32(e + FERRY_PG_E_VALUE_LEN);
    uint64_t counter = (uint64_t)rd32(e + FERRY_PG_E_COUNTER) | (uint64_t)rd32(e + FERRY_PG_E_COUNTER + 4) << 32;
    uint32_t at = off + ENTRY_SIZE + klen;
    uint32_t where = flags & F_OVF ? rd32(pg + at) : at;
    result = Py_BuildValue("(IKIII)", flags, (unsigned long long)counter, vlen, where, size);
done:
    PyBuffer_Release(&b);
    return result;
}

/* -- new_page (page.new_page) --------------------------------------------------------- */

static PyObject *py_new_page(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    /* new_page(index, page_size, ptype, buf=None) -> bytearray: an empty page of type
     * ptype (DATA: empty heap starting at the page end), in ``buf`` when given */
    if (nargs < 3 || nargs > 4) {
        PyErr_Format(PyExc_TypeError, "new_page takes 3 or 4 arguments (index, page_size, "
                     "ptype, buf=None), got %zd", nargs);
        return NULL;
    }
    uint64_t index, ps, ptype;
    if (uint_arg(args[0], UINT32_MAX, &index, "new_page", "page index") < 0 ||
        uint_arg(args[1], MAX_PAGE, &ps, "new_page", "page_size") < 0 ||
        uint_arg(args[2], 255, &ptype, "new_page", "page type") < 0)
        return NULL;
    if (ps < MIN_PAGE || ptype < FERRY_PG_T_META || ptype > FERRY_PG_T_FREE) {
        PyErr_Format(PyExc_ValueError, "new_page: page size %llu / type %llu (pages are %d..%d "
                     "bytes, types 1..4)", (unsigned long long)ps, (unsigned long long)ptype,
                     MIN_PAGE, MAX_PAGE);
        return NULL;
    }
    PyObject *buf = nargs == 4 ? args[3] : Py_None;
    if (buf == Py_None) {
        if (!(buf = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)ps)))
            return NULL;
    }
    else if (!PyByteArray_Check(buf) || PyByteArray_GET_SIZE(buf) != (Py_ssize_t)ps) {
        PyErr_Format(PyExc_ValueError, "new_page: buf must be a bytearray of %llu bytes, not "
                     "%.100s of %zd", (unsigned long long)ps, Py_TYPE(buf)->tp_name,
                     PyObject_Length(buf));
        return NULL;
    }
    else
        Py_INCREF(buf);
    uint8_t *pg = (uint8_t *)PyByteArray_AS_STRING(buf);
    memset(pg, 0, (size_t)ps);
    wr32(pg + FERRY_PG_OFF_INDEX, (uint32_t)index);
    pg[FERRY_PG_OFF_TYPE] = (uint8_t)ptype;
    wr32(pg + FERRY_PG_OFF_AUX, ptype == T_DATA ? (uint32_t)ps : 0);
    return buf;
}

/* -- overflow chains (page.chain_pages) ----------------------------------------------- */

static PyObject *py_chain_pages(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    /* chain_pages(value, page_size, indexes, spare) -> [bytearray]: the OVERFLOW pages of
     * ``value`` on pages ``indexes`` (each links to the next, the last to 0), in buffers
     * popped from the end of the list ``spare`` while it has any, else new. */
    if (nargs != 4) {
        PyErr_Format(PyExc_TypeError, "chain_pages takes 4 arguments (value, page_size, "
                     "indexes, spare), got %zd", nargs);
        return NULL;
    }
    uint64_t ps64;
    if (uint_arg(args[1], MAX_PAGE, &ps64, "chain_pages", "page_size") < 0)
        return NULL;
    if (ps64 < MIN_PAGE) {
        PyErr_Format(PyExc_ValueError, "chain_pages: page size %llu (pages are %d..%d bytes)",
                     (unsigned long long)ps64, MIN_PAGE, MAX_PAGE);
        return NULL;
    }
    PyObject *indexes = args[2], *spare = args[3];
    if (!PyList_Check(indexes) || !PyList_Check(spare)) {
        PyErr_SetString(PyExc_TypeError, "chain_pages: indexes and spare must be lists");
        return NULL;
    }
    Py_buffer vb;
    if (PyObject_GetBuffer(args[0], &vb, PyBUF_SIMPLE) < 0)
        return NULL;
    Py_ssize_t ps = (Py_ssize_t)ps64, room = ps - HDR;
    Py_ssize_t count = vb.len ? (vb.len + room - 1) / room : 1;
    Py_ssize_t n = PyList_GET_SIZE(indexes);
    PyObject *out = NULL;
    uint32_t *idx = NULL;
    if (n != count) {
        PyErr_Format(PyExc_ValueError, "chain_pages: a %zd-byte value takes %zd pages of %zd, "
                     "%zd page indexes given", vb.len, count, ps, n);
        goto fail;
    }
    idx = PyMem_Malloc(sizeof(uint32_t) * (size_t)n);
    if (!idx) {
        PyErr_NoMemory();
        goto fail;
    }
    for (Py_ssize_t i = 0; i < n; i++) {         /* all checked before any page is built */
        uint64_t v;
        if (uint_arg(PyList_GET_ITEM(indexes, i), UINT32_MAX, &v, "chain_pages", "page index") < 0)
            goto fail;
        if (v == 0) {
            PyErr_SetString(PyExc_ValueError, "chain_pages: page 0 (the meta page) in a chain");
            goto fail;
        }
        idx[i] = (uint32_t)v;
    }
    out = PyList_New(n);
    if (!out)
        goto fail;
    const uint8_t *src = vb.buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *buf;
        Py_ssize_t ns = PyList_GET_SIZE(spare);
        if (ns) {
            buf = PyList_GET_ITEM(spare, ns - 1);
            if (!PyByteArray_CheckExact(buf) || PyByteArray_GET_SIZE(buf) != ps) {
                PyErr_Format(PyExc_ValueError, "chain_pages: a spare buffer that is not a "
                             "bytearray of %zd bytes (%.100s)", ps, Py_TYPE(buf)->tp_name);
                goto fail;
            }
            Py_INCREF(buf);
            if (PyList_SetSlice(spare, ns - 1, ns, NULL) < 0) {
                Py_DECREF(buf);
                goto fail;
            }
        }
        else if (!(buf = PyByteArray_FromStringAndSize(NULL, ps)))
            goto fail;
        PyList_SET_ITEM(out, i, buf);
        uint8_t *pg = (uint8_t *)PyByteArray_AS_STRING(buf);
        Py_ssize_t used = vb.len - i * room;
        if (used > room)
            used = room;
        /* header crc 0 | index | OVERFLOW | flags 0 | payload length | next page */
        wr32(pg + FERRY_PG_OFF_CRC, 0);
        wr32(pg + FERRY_PG_OFF_INDEX, idx[i]);
        pg[FERRY_PG_OFF_TYPE] = T_OVF;
        pg[9] = 0;
        wr16(pg + FERRY_PG_OFF_COUNT, (uint32_t)used);
        wr32(pg + FERRY_PG_OFF_AUX, i + 1 < n ? idx[i + 1] : 0);
        memcpy(pg + HDR, src + i * room, (size_t)used);
        memset(pg + HDR + used, 0, (size_t)(room - used));
    }
    PyMem_Free(idx);
    PyBuffer_Release(&vb);
    return out;
fail:
    Py_XDECREF(out);        /* a partly filled list: PyList_New's NULLs are skipped */
    PyMem_Free(idx);
    PyBuffer_Release(&vb);
    return NULL;
}

static PyMethodDef methods[] = {
    {"chain_pages", (PyCFunction)(void (*)(void))py_chain_pages, METH_FASTCALL,
     "chain_pages(value, page_size, indexes, spare) -> [bytearray] (page.chain_pages)"},
    {"insert", (PyCFunction)(void (*)(void))py_insert, METH_FASTCALL,
     "insert(buf, free, flags, key, counter, value_len, stored) -> (slot, used) | None"},
    {"delete", (PyCFunction)(void (*)(void))py_delete, METH_FASTCALL,
     "delete(buf, slot, size) -> freed bytes (page.delete)"},
    {"read_entry", (PyCFunction)(void (*)(void))py_read_entry, METH_FASTCALL,
     "read_entry(buf, slot) -> (flags, counter, value_len, where, size)"},
    {"compact", py_compact, METH_O, "compact(buf) -> heap start (page.compact)"},
    {"new_page", (PyCFunction)(void (*)(void))py_new_page, METH_FASTCALL,
     "new_page(index, page_size, ptype, buf=None) -> bytearray (page.new_page)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moddef = {
    PyModuleDef_HEAD_INIT, "checkpoint._writeaccel",
    "Page write path of checkpoint.page in C (optional; see that module).", -1, methods,
};

PyMODINIT_FUNC PyInit__writeaccel(void)
{
    PyObject *m = PyModule_Create(&moddef);
    if (!m)
        return NULL;
    if (PyModule_AddIntConstant(m, "ABI_VERSION", ABI_VERSION) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
