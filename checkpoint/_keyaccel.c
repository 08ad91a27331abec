/* checkpoint._keyaccel: the bulk fast path of the key index (checkpoint/keyindex.py).
 *
 * An optional accelerator. It does the two per-key loops of building an index at
 * open/install time, with the table layout decided by Python:
 *
 * - page_hashes(pages) / hash_items(items): the xxh3-64 hash of every key (exactly
 *   xxhash.xxh3_64_intdigest: the system's xxhash.h, inlined) and its location, packed
 *   into two bytes objects of u64 (no per-key Python object);
 * - place(src_h, src_l, start, shift, hashes, locs, masks, used): linear-probing
 *   insertion of those (hash, location) pairs into the segment tables (the array('Q')
 *   buffers, written in place), in order, exactly as KeyIndex._place does. It never
 *   grows a table: when the next pair would push its segment past the load limit it
 *   stops and returns (position, segment); Python grows that segment (with place()
 *   again, into the new table) and calls back from that position. So the tables,
 *   the order of insertion and every growth step are those of the pure-Python code,
 *   and the resulting state is identical by construction.
 *
 * Keep MAX_LOAD_NUM/DEN equal to keyindex.py's (the ABI version says so).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define XXH_INLINE_ALL      /* header-only: nothing to link */
#include <xxhash.h>

#define ABI_VERSION 1       /* keyindex.py refuses a module built from another version */
#define MAX_LOAD_NUM 3
#define MAX_LOAD_DEN 4
#define MAX_SEGMENTS 64
#define PREFETCH 16         /* place(): pairs ahead whose home slot is prefetched (misses overlap) */

/* The 64-bit hash of a bytes-like key; -1 with an exception set on a non-buffer. */
static int key_hash(PyObject *key, uint64_t *out)
{
    if (PyBytes_CheckExact(key)) {
        *out = XXH3_64bits(PyBytes_AS_STRING(key), (size_t)PyBytes_GET_SIZE(key));
        return 0;
    }
    Py_buffer b;
    if (PyObject_GetBuffer(key, &b, PyBUF_SIMPLE) < 0)
        return -1;
    *out = XXH3_64bits(b.buf, (size_t)b.len);
    PyBuffer_Release(&b);
    return 0;
}

/* A location: an int > 0 (0 marks an empty slot), as KeyIndex.add refuses. */
static int location(PyObject *o, uint64_t *out)
{
    if (!PyLong_Check(o)) {
        PyErr_Format(PyExc_TypeError, "location must be int, not %.100s", Py_TYPE(o)->tp_name);
        return -1;
    }
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (v == -1 && PyErr_Occurred())
        return -1;
    if (overflow < 0 || (!overflow && v <= 0)) {
        PyErr_SetString(PyExc_ValueError, "location 0 is the empty-slot marker");
        return -1;
    }
    if (overflow) {
        unsigned long long u = PyLong_AsUnsignedLongLong(o);
        if (u == (unsigned long long)-1 && PyErr_Occurred())
            return -1;
        *out = u;
    }
    else
        *out = (uint64_t)v;
    return 0;
}

/* Two new bytes objects of n u64 each (uninitialised). */
static int new_columns(Py_ssize_t n, PyObject **h, PyObject **l)
{
    *h = PyBytes_FromStringAndSize(NULL, n * 8);
    *l = PyBytes_FromStringAndSize(NULL, n * 8);
    if (!*h || !*l) {
        Py_CLEAR(*h);
        Py_CLEAR(*l);
        return -1;
    }
    return 0;
}

static PyObject *columns_result(PyObject *h, PyObject *l, int failed)
{
    if (failed) {
        Py_DECREF(h);
        Py_DECREF(l);
        return NULL;
    }
    return Py_BuildValue("(NN)", h, l);
}

static PyObject *py_hash(PyObject *self, PyObject *key)
{
    uint64_t h;
    if (key_hash(key, &h) < 0)
        return NULL;
    return PyLong_FromUnsignedLongLong(h);
}

static PyObject *py_hash_items(PyObject *self, PyObject *items)
{
    /* hash_items([(key, loc), ...]) -> (hashes, locs): u64 columns (bytes). */
    if (!PyList_Check(items)) {
        PyErr_SetString(PyExc_TypeError, "hash_items: a list of (key, location) pairs");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(items);
    PyObject *ho, *lo;
    if (new_columns(n, &ho, &lo) < 0)
        return NULL;
    uint64_t *hs = (uint64_t *)PyBytes_AS_STRING(ho), *ls = (uint64_t *)PyBytes_AS_STRING(lo);
    int failed = 0;
    for (Py_ssize_t i = 0; i < n && !failed; i++) {
        /* any pair, as Python's `for k, loc in items` takes (tuples fast) */
        PyObject *pair = PySequence_Fast(PyList_GET_ITEM(items, i),
                                         "hash_items: items must be (key, location) pairs");
        if (!pair)
            failed = 1;
        else if (PySequence_Fast_GET_SIZE(pair) != 2) {
            PyErr_SetString(PyExc_TypeError, "hash_items: items must be (key, location) pairs");
            failed = 1;
        }
        else
            failed = key_hash(PySequence_Fast_GET_ITEM(pair, 0), &hs[i]) < 0 ||
                     location(PySequence_Fast_GET_ITEM(pair, 1), &ls[i]) < 0;
        Py_XDECREF(pair);
    }
    return columns_result(ho, lo, failed);
}

/* A growing pair of u64 columns. */
typedef struct {
    uint64_t *h, *l;
    Py_ssize_t n, cap;
} cols;

static int cols_push(cols *c, uint64_t h, uint64_t l)
{
    if (c->n == c->cap) {
        Py_ssize_t cap = c->cap ? 2 * c->cap : 4096;
        uint64_t *nh = PyMem_Realloc(c->h, (size_t)cap * 8);
        if (!nh) {
            PyErr_NoMemory();
            return -1;
        }
        c->h = nh;
        uint64_t *nl = PyMem_Realloc(c->l, (size_t)cap * 8);
        if (!nl) {
            PyErr_NoMemory();
            return -1;
        }
        c->l = nl;
        c->cap = cap;
    }
    c->h[c->n] = h;
    c->l[c->n++] = l;
    return 0;
}

static void cols_free(cols *c)
{
    PyMem_Free(c->h);
    PyMem_Free(c->l);
    c->h = c->l = NULL;
}

/* (hashes, locs) as bytes of u64, or (hashes, locs, more) when `more` is given. */
static PyObject *cols_result(cols *c, PyObject *more)
{
    PyObject *ho = PyBytes_FromStringAndSize((const char *)c->h, c->n * 8);
    PyObject *lo = PyBytes_FromStringAndSize((const char *)c->l, c->n * 8);
    if (!ho || !lo) {
        Py_XDECREF(ho);
        Py_XDECREF(lo);
        return NULL;
    }
    return more ? Py_BuildValue("(NNO)", ho, lo, more) : Py_BuildValue("(NN)", ho, lo);
}

/* The keys of one iter_page_keys item (page number `index`) onto the columns. */
static int push_page_keys(cols *c, unsigned long long index, PyObject *keys)
{
    for (Py_ssize_t s = 0; s < PyList_GET_SIZE(keys); s++) {
        PyObject *it = PyList_GET_ITEM(keys, s);
        if (!PyTuple_Check(it) || PyTuple_GET_SIZE(it) != 2) {
            PyErr_SetString(PyExc_TypeError, "keys must be (slot, key) tuples");
            return -1;
        }
        unsigned long slot = PyLong_AsUnsignedLong(PyTuple_GET_ITEM(it, 0));
        if (slot == (unsigned long)-1 && PyErr_Occurred())
            return -1;
        uint64_t h, loc = (uint64_t)index << 16 | slot;
        if (slot >> 16 || !loc) {
            PyErr_SetString(PyExc_ValueError, slot >> 16 ? "slot beyond 16 bits"
                                                         : "location 0 is the empty-slot marker");
            return -1;
        }
        if (key_hash(PyTuple_GET_ITEM(it, 1), &h) < 0 || cols_push(c, h, loc) < 0)
            return -1;
    }
    return 0;
}

static PyObject *py_scan_pages(PyObject *self, PyObject *args)
{
    /* scan_pages(pages_iter, limit, page_size, quarter, space, roomy, free_pages)
     *   -> (hashes, locs, more)
     * Partition._scan's per-page loop: pulls iter_page_keys items until at least
     * `limit` keys (then more=True) or the end (more=False). A FREE page (type 4) is
     * appended to free_pages; a DATA page sets space[page] = page_size - used, joins
     * the roomy set when that is >= quarter, and its keys become (xxh3-64, page << 16
     * | slot) pairs of the returned u64 columns. Errors of the iterator propagate. */
    PyObject *iter, *roomy, *free_pages, *space_obj;
    Py_ssize_t limit;
    unsigned long long ps, quarter;
    if (!PyArg_ParseTuple(args, "OnKKOO!O!", &iter, &limit, &ps, &quarter, &space_obj,
                          &PySet_Type, &roomy, &PyList_Type, &free_pages))
        return NULL;
    Py_buffer sp;
    if (PyObject_GetBuffer(space_obj, &sp, PyBUF_WRITABLE | PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0)
        return NULL;
    cols c = {NULL, NULL, 0, 0};
    PyObject *result = NULL, *page = NULL;
    int more = 0;
    if (sp.itemsize != 4 || !sp.format || strcmp(sp.format, "I") != 0) {
        PyErr_SetString(PyExc_TypeError, "scan_pages: space must be an array('I')");
        goto done;
    }
    uint32_t *space = (uint32_t *)sp.buf;
    Py_ssize_t nspace = sp.len / 4;
    while ((page = PyIter_Next(iter)) != NULL) {
        if (!PyTuple_Check(page) || PyTuple_GET_SIZE(page) != 4 ||
                !PyList_Check(PyTuple_GET_ITEM(page, 3))) {
            PyErr_SetString(PyExc_TypeError, "scan_pages: items must be (page, type, used, keys)");
            goto done;
        }
        PyObject *io = PyTuple_GET_ITEM(page, 0), *keys = PyTuple_GET_ITEM(page, 3);
        long type = PyLong_AsLong(PyTuple_GET_ITEM(page, 1));
        unsigned long long index = PyLong_AsUnsignedLongLong(io);
        unsigned long long used = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(page, 2));
        if (PyErr_Occurred())
            goto done;
        if (type == 4) {                         /* FREE */
            if (PyList_Append(free_pages, io) < 0)
                goto done;
        }
        else {
            if ((Py_ssize_t)index >= nspace || index >> 48 || used > ps) {
                PyErr_SetString(PyExc_IndexError, "scan_pages: page beyond the space map");
                goto done;
            }
            uint64_t free = ps - used;
            space[index] = (uint32_t)free;
            if (free >= quarter && PySet_Add(roomy, io) < 0)
                goto done;
            if (push_page_keys(&c, index, keys) < 0)
                goto done;
        }
        Py_CLEAR(page);
        if (c.n >= limit) {
            more = 1;
            break;
        }
    }
    if (PyErr_Occurred())
        goto done;
    result = cols_result(&c, more ? Py_True : Py_False);
done:
    Py_XDECREF(page);
    cols_free(&c);
    PyBuffer_Release(&sp);
    return result;
}

static PyObject *py_page_hashes(PyObject *self, PyObject *pages)
{
    /* page_hashes([(page, type, used, [(slot, key), ...]), ...]) -> (hashes, locs):
     * iter_page_keys' items; location = page << 16 | slot. */
    if (!PyList_Check(pages)) {
        PyErr_SetString(PyExc_TypeError, "page_hashes: a list of iter_page_keys items");
        return NULL;
    }
    cols c = {NULL, NULL, 0, 0};
    PyObject *result = NULL;
    for (Py_ssize_t p = 0; p < PyList_GET_SIZE(pages); p++) {
        PyObject *pg = PyList_GET_ITEM(pages, p);
        if (!PyTuple_Check(pg) || PyTuple_GET_SIZE(pg) != 4 || !PyList_Check(PyTuple_GET_ITEM(pg, 3))) {
            PyErr_SetString(PyExc_TypeError,
                            "page_hashes: items must be (page, type, used, [(slot, key)]) tuples");
            goto done;
        }
        unsigned long long index = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(pg, 0));
        if (index == (unsigned long long)-1 && PyErr_Occurred())
            goto done;
        if (index >> 48) {
            PyErr_SetString(PyExc_ValueError, "page_hashes: page number beyond 48 bits");
            goto done;
        }
        if (push_page_keys(&c, index, PyTuple_GET_ITEM(pg, 3)) < 0)
            goto done;
    }
    result = cols_result(&c, NULL);
done:
    cols_free(&c);
    return result;
}

/* The segment tables of one place() call: writable views of the array('Q') columns. */
typedef struct {
    Py_ssize_t nseg;
    Py_buffer hb[MAX_SEGMENTS], lb[MAX_SEGMENTS];
    uint64_t mask[MAX_SEGMENTS], used[MAX_SEGMENTS];
    int held;               /* buffers acquired (pairs) */
} tables;

static void tables_release(tables *t)
{
    for (int s = 0; s < t->held; s++) {
        PyBuffer_Release(&t->hb[s]);
        PyBuffer_Release(&t->lb[s]);
    }
    t->held = 0;
}

static int get_column(PyObject *o, Py_buffer *b, uint64_t slots)
{
    if (PyObject_GetBuffer(o, b, PyBUF_WRITABLE | PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0)
        return -1;
    if (b->itemsize != 8 || !b->format || strcmp(b->format, "Q") != 0 ||
            (uint64_t)b->len != slots * 8) {
        PyBuffer_Release(b);
        PyErr_SetString(PyExc_ValueError, "place: a table is not an array('Q') of mask + 1 slots");
        return -1;
    }
    return 0;
}

static int tables_get(tables *t, PyObject *hashes, PyObject *locs, PyObject *masks, PyObject *used)
{
    t->held = 0;
    if (!PyList_Check(hashes) || !PyList_Check(locs) || !PyList_Check(masks) || !PyList_Check(used)) {
        PyErr_SetString(PyExc_TypeError, "place: hashes, locs, masks and used must be lists");
        return -1;
    }
    t->nseg = PyList_GET_SIZE(hashes);
    if (t->nseg < 1 || t->nseg > MAX_SEGMENTS || (t->nseg & (t->nseg - 1)) ||
            PyList_GET_SIZE(locs) != t->nseg || PyList_GET_SIZE(masks) != t->nseg ||
            PyList_GET_SIZE(used) != t->nseg) {
        PyErr_SetString(PyExc_ValueError, "place: 1..64 segments (a power of two) in every list");
        return -1;
    }
    for (Py_ssize_t s = 0; s < t->nseg; s++) {
        unsigned long long m = PyLong_AsUnsignedLongLong(PyList_GET_ITEM(masks, s));
        unsigned long long u = PyLong_AsUnsignedLongLong(PyList_GET_ITEM(used, s));
        if (PyErr_Occurred())
            goto fail;
        if ((m + 1) & m) {
            PyErr_SetString(PyExc_ValueError, "place: a mask is not a power of two minus one");
            goto fail;
        }
        t->mask[s] = m;
        t->used[s] = u;
        if (get_column(PyList_GET_ITEM(hashes, s), &t->hb[s], m + 1) < 0)
            goto fail;
        if (get_column(PyList_GET_ITEM(locs, s), &t->lb[s], m + 1) < 0) {
            PyBuffer_Release(&t->hb[s]);
            goto fail;
        }
        t->held = (int)s + 1;
    }
    return 0;
fail:
    tables_release(t);
    return -1;
}

static PyObject *py_place(PyObject *self, PyObject *args)
{
    /* place(src_h, src_l, start, shift, hashes, locs, masks, used) -> None | (i, seg):
     * insert pairs start.. of the columns (pairs with location 0 are skipped: a table
     * being rehashed) into the segment tables; `used` is updated in place. Stops
     * before pair i when its segment seg is full (Python grows it and calls again). */
    Py_buffer sh, sl;
    Py_ssize_t start;
    int shift;
    PyObject *hashes, *locs, *masks, *used;
    if (!PyArg_ParseTuple(args, "y*y*niO!O!O!O!", &sh, &sl, &start, &shift, &PyList_Type, &hashes,
                          &PyList_Type, &locs, &PyList_Type, &masks, &PyList_Type, &used))
        return NULL;
    PyObject *result = NULL;
    tables t;
    t.held = 0;
    if (sh.len != sl.len || sh.len % 8 || start < 0 || shift < 0 || shift > 64) {
        PyErr_SetString(PyExc_ValueError, "place: columns of equal length, 0 <= shift <= 64");
        goto done;
    }
    if (tables_get(&t, hashes, locs, masks, used) < 0)
        goto done;
    if (64 - shift > 6 || t.nseg != (Py_ssize_t)1 << (64 - shift)) {
        PyErr_SetString(PyExc_ValueError, "place: shift does not match the segment count");
        goto done;
    }
    Py_ssize_t n = sh.len / 8, i = start;
    int full = 0, lost = 0;
    {
        const uint8_t *hp = (const uint8_t *)sh.buf, *lp = (const uint8_t *)sl.buf;
        /* Only this call's buffers are touched (the exports pin the tables), so the
         * other threads of a node may run during a big batch. */
        PyThreadState *ts = n - i >= 4096 ? PyEval_SaveThread() : NULL;
        for (; i < n; i++) {
            uint64_t h, loc;
            if (i + PREFETCH < n) {             /* the home slot of a pair further on */
                uint64_t ph;
                memcpy(&ph, hp + 8 * (i + PREFETCH), 8);
                uint64_t ps = shift >= 64 ? 0 : ph >> shift;
                uint64_t at = ph & t.mask[ps];
                __builtin_prefetch((uint64_t *)t.lb[ps].buf + at, 1);
                __builtin_prefetch((uint64_t *)t.hb[ps].buf + at, 1);
            }
            memcpy(&loc, lp + 8 * i, 8);        /* the columns may be unaligned (bytes) */
            if (!loc)
                continue;
            memcpy(&h, hp + 8 * i, 8);
            uint64_t seg = shift >= 64 ? 0 : h >> shift;
            uint64_t mask = t.mask[seg];
            if ((t.used[seg] + 1) * MAX_LOAD_DEN > (mask + 1) * MAX_LOAD_NUM) {
                full = 1;
                break;
            }
            uint64_t *th = (uint64_t *)t.hb[seg].buf, *tl = (uint64_t *)t.lb[seg].buf;
            uint64_t j = h & mask, probes = 0;
            while (tl[j] && probes++ <= mask)   /* load < 1: an empty slot exists */
                j = (j + 1) & mask;
            if (tl[j]) {                        /* `used` understated: not our tables */
                lost = 1;
                break;
            }
            th[j] = h;
            tl[j] = loc;
            t.used[seg]++;
        }
        if (ts)
            PyEval_RestoreThread(ts);
    }
    for (Py_ssize_t s = 0; s < t.nseg; s++) {  /* the pairs placed so far, even on error */
        PyObject *u = PyLong_FromUnsignedLongLong(t.used[s]);
        if (!u || PyList_SetItem(used, s, u) < 0)
            goto done;
    }
    if (lost) {
        PyErr_SetString(PyExc_RuntimeError, "place: a segment is full although `used` says not");
        goto done;
    }
    if (full) {
        uint64_t h;
        memcpy(&h, (const uint8_t *)sh.buf + 8 * i, 8);
        result = Py_BuildValue("(nK)", i, (unsigned long long)(shift >= 64 ? 0 : h >> shift));
    }
    else
        result = Py_NewRef(Py_None);
done:
    tables_release(&t);
    PyBuffer_Release(&sh);
    PyBuffer_Release(&sl);
    return result;
}

static PyMethodDef methods[] = {
    {"hash", py_hash, METH_O, "hash(key) -> int: xxh3-64 (= xxhash.xxh3_64_intdigest)"},
    {"hash_items", py_hash_items, METH_O, "hash_items([(key, loc)]) -> (hashes, locs) u64 columns"},
    {"page_hashes", py_page_hashes, METH_O,
     "page_hashes([(page, type, used, [(slot, key)])]) -> (hashes, locs) u64 columns"},
    {"scan_pages", py_scan_pages, METH_VARARGS,
     "scan_pages(pages_iter, limit, page_size, quarter, space, roomy, free_pages) "
     "-> (hashes, locs, more)"},
    {"place", py_place, METH_VARARGS,
     "place(src_h, src_l, start, shift, hashes, locs, masks, used) -> None | (i, seg)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moddef = {
    PyModuleDef_HEAD_INIT, "checkpoint._keyaccel",
    "Bulk fast path of checkpoint.keyindex (optional; see that module).", -1, methods,
};

PyMODINIT_FUNC PyInit__keyaccel(void)
{
    PyObject *m = PyModule_Create(&moddef);
    if (!m)
        return NULL;
    if (PyModule_AddIntConstant(m, "ABI_VERSION", ABI_VERSION) < 0 ||
        PyModule_AddIntConstant(m, "MAX_LOAD_NUM", MAX_LOAD_NUM) < 0 ||
        PyModule_AddIntConstant(m, "MAX_LOAD_DEN", MAX_LOAD_DEN) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
