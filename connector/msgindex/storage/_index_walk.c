/*
 * RocketMQ's selectPhyOffset over a mapped IndexFile, compiled: the hash of the key and the walk of
 * its chain in one call, without a Python object per step.
 *
 * Why compiled: in Python a call costs ~2.8 us with everything cached (the exact Java hash ~0.6 us,
 * each walk step ~0.15 us, the rest the call, the header and the slot), about twice what the JVM
 * spends (BENCHMARKS.md, "Hash index"). This file answers exactly what
 * ``IndexFile.reference_select_phy_offsets`` answers (its test oracle, itself checked against
 * RocketMQ's jar); where it cannot (arguments outside C's integer types, a buffer that does not hold
 * the layout it is told) it returns None and the Python walk answers. The build is optional
 * (pyproject.toml): without a C compiler, or where msgindex arrives as a zip (Spark executors), the
 * Python walk is used.
 *
 * Layout (index_file.py's table; big-endian): header 40 B (beginTimestamp i64 at 0, indexCount i32
 * at 36), slots of 4 B (newest entry of the chain), entries of 20 B (keyHash i32, phyOffset i64,
 * timeDiff i32 seconds, prevIndex i32).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#define HEADER_SIZE 40
#define BEGIN_TIMESTAMP_AT 0
#define INDEX_COUNT_AT 36
#define SLOT_SIZE 4
#define ENTRY_SIZE 20
#define ENTRY_PHY_AT 4
#define ENTRY_DIFF_AT 12
#define ENTRY_PREV_AT 16
#define INVALID_INDEX 0 /* a slot or prevIndex meaning "no entry" */
#define FIRST_INDEX 1   /* indexCount of an empty file */
#define TIME_DIFF_UNIT_MS 1000

static int32_t read_i32(const unsigned char *at) {
    return (int32_t)(((uint32_t)at[0] << 24) | ((uint32_t)at[1] << 16) | ((uint32_t)at[2] << 8) | (uint32_t)at[3]);
}

static int64_t read_i64(const unsigned char *at) {
    return (int64_t)(((uint64_t)(uint32_t)read_i32(at) << 32) | (uint64_t)(uint32_t)read_i32(at + 4));
}

/* Java's String.hashCode over the UTF-16 units Java would hold for `key` (a code point above
 * U+FFFF is a surrogate pair; a lone surrogate, legal in a Python str, is one unit), then
 * RocketMQ's indexKeyHashMethod: Math.abs, with Integer.MIN_VALUE (its own abs) mapped to 0. */
static int32_t index_hash(PyObject *key) {
    int kind = PyUnicode_KIND(key);
    const void *data = PyUnicode_DATA(key);
    Py_ssize_t length = PyUnicode_GET_LENGTH(key);
    uint32_t h = 0; /* Java's int arithmetic wraps: unsigned here, where wrapping is defined */
    if (kind == PyUnicode_1BYTE_KIND) {
        const Py_UCS1 *units = (const Py_UCS1 *)data;
        for (Py_ssize_t i = 0; i < length; i++) h = 31 * h + units[i];
    } else {
        for (Py_ssize_t i = 0; i < length; i++) {
            Py_UCS4 point = PyUnicode_READ(kind, data, i);
            if (point > 0xFFFF) {
                point -= 0x10000;
                h = 31 * h + (0xD800 + (point >> 10));
                h = 31 * h + (0xDC00 + (point & 0x3FF));
            } else {
                h = 31 * h + point;
            }
        }
    }
    int32_t java_hash = (int32_t)h;
    if (java_hash == INT32_MIN) return 0;
    return java_hash < 0 ? -java_hash : java_hash;
}

static int as_int64(PyObject *value, int64_t *out) {
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (overflow || (v == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return 0;
    }
    *out = (int64_t)v;
    return 1;
}

/* select_phy_offsets(buffer, key, hash_slot_num, capacity, max_num, begin, end) -> list | None
 * capacity: the entries the buffer has room for (index_num once the file is full size) */
static PyObject *select_phy_offsets(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "select_phy_offsets takes 7 arguments");
        return NULL;
    }
    int64_t slot_num, capacity, max_num, begin, end;
    if (!PyUnicode_Check(args[1]) || !as_int64(args[2], &slot_num) || !as_int64(args[3], &capacity) ||
        !as_int64(args[4], &max_num) || !as_int64(args[5], &begin) || !as_int64(args[6], &end) || slot_num <= 0 ||
        capacity <= 0 || slot_num > INT32_MAX || capacity > INT32_MAX) {
        Py_RETURN_NONE;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) != 0) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    const int64_t entries_at = HEADER_SIZE + slot_num * SLOT_SIZE;
    if ((int64_t)view.len < entries_at + capacity * ENTRY_SIZE) { /* not the layout it is said to be */
        PyBuffer_Release(&view);
        Py_RETURN_NONE;
    }
    const unsigned char *file = (const unsigned char *)view.buf;
    int32_t key_hash = index_hash(args[1]);
    int64_t begin_ts = read_i64(file + BEGIN_TIMESTAMP_AT);
    int64_t count = read_i32(file + INDEX_COUNT_AT);
    int64_t cur = read_i32(file + HEADER_SIZE + (int64_t)(key_hash % slot_num) * SLOT_SIZE);
    /* a walk never goes past indexCount, nor past the file's room */
    int64_t last = count < capacity - 1 ? count : capacity - 1;
    PyObject *found = PyList_New(0);
    if (found == NULL || cur <= INVALID_INDEX || cur > last || count <= FIRST_INDEX || max_num <= 0) {
        PyBuffer_Release(&view);
        return found;
    }
    /* As the JVM walks: a cyclic chain (a corrupt file) gives what the JVM gives while results keep
     * coming; where the JVM would spin forever (indexCount steps without a result) the walk ends. */
    int64_t idle_steps = 0;
    while (idle_steps <= count) {
        idle_steps++;
        const unsigned char *entry = file + entries_at + cur * ENTRY_SIZE;
        int32_t diff = read_i32(entry + ENTRY_DIFF_AT);
        if (diff < 0) break;
        /* beginTimestamp + timeDiff * 1000 in Java long arithmetic (wraps near Long.MAX_VALUE) */
        int64_t stamp = (int64_t)((uint64_t)begin_ts + (uint64_t)diff * TIME_DIFF_UNIT_MS);
        if (read_i32(entry) == key_hash && begin <= stamp && stamp <= end) {
            PyObject *phy = PyLong_FromLongLong(read_i64(entry + ENTRY_PHY_AT));
            if (phy == NULL || PyList_Append(found, phy) != 0) {
                Py_XDECREF(phy);
                Py_DECREF(found);
                PyBuffer_Release(&view);
                return NULL;
            }
            Py_DECREF(phy);
            if (PyList_GET_SIZE(found) >= max_num) break;
            idle_steps = 0;
        }
        int64_t prev = read_i32(entry + ENTRY_PREV_AT);
        if (prev <= INVALID_INDEX || prev > last || prev == cur || stamp < begin) break;
        cur = prev;
    }
    PyBuffer_Release(&view);
    return found;
}

static PyMethodDef methods[] = {
    {"select_phy_offsets", (PyCFunction)(void (*)(void))select_phy_offsets, METH_FASTCALL,
     "select_phy_offsets(buffer, key, hash_slot_num, capacity, max_num, begin, end): RocketMQ's "
     "selectPhyOffset over an IndexFile's bytes, or None where the Python walk must answer."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_index_walk", "RocketMQ's selectPhyOffset, compiled (see index_file.py).", -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__index_walk(void) { return PyModule_Create(&module_def); }
