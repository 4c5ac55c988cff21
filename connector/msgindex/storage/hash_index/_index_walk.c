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
#define WALK_GROUP 32 /* chains walked side by side by walk_chains */

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

/* Growable int64 column of walk_chains' output. */
typedef struct {
    int64_t *data;
    Py_ssize_t size, room;
} column_t;

static int push(column_t *column, int64_t value) {
    if (column->size == column->room) {
        Py_ssize_t room = column->room ? column->room * 2 : 1024;
        int64_t *grown = PyMem_Realloc(column->data, (size_t)room * sizeof(int64_t));
        if (grown == NULL) return 0;
        column->data = grown;
        column->room = room;
    }
    column->data[column->size++] = value;
    return 1;
}

static PyObject *column_bytes(column_t *column) {
    return PyBytes_FromStringAndSize((const char *)column->data, column->size * (Py_ssize_t)sizeof(int64_t));
}

/* walk_chains(buffer, hashes, heads, entries_at, capacity, limit, floor, chunk_shift)
 *   -> (who, entry, phy_offset, time_diff, touched_chunks) as bytes of native int64s, or None
 * (touched_chunks: the chunks the walks read, a chunk again where a walk comes back to it)
 *
 * The numpy lock-step walk of IndexFile.candidate_arrays (of the chains no hash run shortens), each chain
 * walked to its end: from the key's head (`heads`: the slot's newest entry, read by the caller
 * once, before it mapped the file far enough for all of them: a head read here could be past a
 * mapping a writer outgrew meanwhile), while floor <= cur < capacity and cur is an
 * entry (> INVALID_INDEX), entry cur is read (its chunk, cur >> chunk_shift, is touched) and is a hit
 * when cur < limit and its keyHash equals the key's hash; the walk goes on to prevIndex only while it
 * points backwards, so a corrupt (cyclic) chain ends. `hashes` and `heads`: native int64s, one each
 * per key, hashes >= 0 (RocketMQ's key hashes); each key's hits come newest first (keys' hits
 * interleave). None when an argument
 * is outside what C holds or the buffer is shorter than the layout: the numpy walk answers. */
static PyObject *walk_chains(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "walk_chains takes 8 arguments");
        return NULL;
    }
    int64_t entries_at, capacity, limit, floor, shift;
    if (!as_int64(args[3], &entries_at) || !as_int64(args[4], &capacity) || !as_int64(args[5], &limit) ||
        !as_int64(args[6], &floor) || !as_int64(args[7], &shift) || capacity <= 0 || capacity > INT32_MAX ||
        shift < 0 || shift > 30 || entries_at < 0) {
        Py_RETURN_NONE;
    }
    Py_buffer file_view, hash_view, head_view;
    if (PyObject_GetBuffer(args[0], &file_view, PyBUF_SIMPLE) != 0) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    if (PyObject_GetBuffer(args[1], &hash_view, PyBUF_SIMPLE) != 0) {
        PyErr_Clear();
        PyBuffer_Release(&file_view);
        Py_RETURN_NONE;
    }
    if (PyObject_GetBuffer(args[2], &head_view, PyBUF_SIMPLE) != 0) {
        PyErr_Clear();
        PyBuffer_Release(&hash_view);
        PyBuffer_Release(&file_view);
        Py_RETURN_NONE;
    }
    PyObject *result = NULL;
    column_t who = {0}, entry_of = {0}, phy = {0}, diff = {0}, chunks = {0};
    const int64_t *hashes = (const int64_t *)hash_view.buf;
    const int64_t *heads = (const int64_t *)head_view.buf;
    Py_ssize_t keys = hash_view.len / (Py_ssize_t)sizeof(int64_t);
    /* (compared by division: a product of what the caller passes could overflow) */
    if (entries_at > (int64_t)file_view.len || capacity > ((int64_t)file_view.len - entries_at) / ENTRY_SIZE ||
        hash_view.len % sizeof(int64_t) || head_view.len != hash_view.len) {
        PyBuffer_Release(&head_view);
        PyBuffer_Release(&hash_view);
        PyBuffer_Release(&file_view);
        Py_RETURN_NONE;
    }
    const unsigned char *file = (const unsigned char *)file_view.buf;
    /* Chains are walked WALK_GROUP keys at a time, one step of each in turn: a step's read of an
     * entry is a cache (often a TLB) miss in a big file, and the misses of different keys' steps
     * overlap where one chain's, each depending on the last, cannot (50,000 keys over a 10M-entry
     * file: 0.35 s walked one chain after another, as slow as numpy's lock-step). */
    for (Py_ssize_t group = 0; group < keys; group += WALK_GROUP) {
        Py_ssize_t members = keys - group < WALK_GROUP ? keys - group : WALK_GROUP;
        int64_t cur[WALK_GROUP], last_chunk[WALK_GROUP];
        Py_ssize_t alive = 0;
        for (Py_ssize_t i = 0; i < members; i++) {
            int64_t key_hash = hashes[group + i];
            if (key_hash < 0) { /* not a RocketMQ key hash: the numpy walk decides what it means */
                result = Py_None;
                Py_INCREF(result);
                goto done;
            }
            cur[i] = heads[group + i];
            last_chunk[i] = -1;
            alive++;
        }
        while (alive) {
            alive = 0;
            for (Py_ssize_t i = 0; i < members; i++) {
                int64_t at = cur[i];
                if (!(at >= floor && at > INVALID_INDEX && at < capacity)) continue;
                const unsigned char *entry = file + entries_at + at * ENTRY_SIZE;
                /* each chunk a walk enters, once per stay (the caller takes them once each: a
                 * table of every chunk of the file, cleared and swept per call, cost more than
                 * the walk of a short chain) */
                if (at >> shift != last_chunk[i]) {
                    last_chunk[i] = at >> shift;
                    if (!push(&chunks, last_chunk[i])) {
                        PyErr_NoMemory();
                        goto done;
                    }
                }
                if (at < limit && (int64_t)read_i32(entry) == hashes[group + i]) {
                    if (!push(&who, group + i) || !push(&entry_of, at) || !push(&phy, read_i64(entry + ENTRY_PHY_AT)) ||
                        !push(&diff, read_i32(entry + ENTRY_DIFF_AT))) {
                        PyErr_NoMemory();
                        goto done;
                    }
                }
                int64_t prev = read_i32(entry + ENTRY_PREV_AT);
                cur[i] = prev < at ? prev : INVALID_INDEX; /* a chain only points backwards */
                if (cur[i] >= floor && cur[i] > INVALID_INDEX && cur[i] < capacity) {
                    __builtin_prefetch(file + entries_at + cur[i] * ENTRY_SIZE);
                    alive++;
                }
            }
        }
    }
    result = Py_BuildValue("(NNNNN)", column_bytes(&who), column_bytes(&entry_of), column_bytes(&phy),
                           column_bytes(&diff), column_bytes(&chunks));
done:
    PyMem_Free(who.data);
    PyMem_Free(entry_of.data);
    PyMem_Free(phy.data);
    PyMem_Free(diff.data);
    PyMem_Free(chunks.data);
    PyBuffer_Release(&head_view);
    PyBuffer_Release(&hash_view);
    PyBuffer_Release(&file_view);
    return result;
}

static PyMethodDef methods[] = {
    {"select_phy_offsets", (PyCFunction)(void (*)(void))select_phy_offsets, METH_FASTCALL,
     "select_phy_offsets(buffer, key, hash_slot_num, capacity, max_num, begin, end): RocketMQ's "
     "selectPhyOffset over an IndexFile's bytes, or None where the Python walk must answer."},
    {"walk_chains", (PyCFunction)(void (*)(void))walk_chains, METH_FASTCALL,
     "walk_chains(buffer, hashes, heads, entries_at, capacity, limit, floor, chunk_shift): "
     "IndexFile.candidate_arrays' chain walks of many keys (no hash runs), or None where numpy must walk."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_index_walk", "RocketMQ's selectPhyOffset, compiled (see index_file.py).", -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__index_walk(void) { return PyModule_Create(&module_def); }
