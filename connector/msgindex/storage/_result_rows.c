/*
 * A point read's result rows verified, ordered and built in C, handed to pyarrow as one record
 * batch through the Arrow C Data Interface: ``VerifiedReads._plain_few`` for records read by the
 * compiled reader (``_blocks.read_records``), and that method is its oracle (the tests compare the
 * two on every lookup they make, windows, partitions and limits included).
 *
 * Why compiled: a lookup of a key of a hundred records spent ~280 us of ~1.1 ms in Python after
 * its blocks were read: cutting each record's texts into str objects, checking each one, a tuple
 * per row and pyarrow's conversion of the tuples (BENCHMARKS.md, "Where one-key p99 stands").
 * Building the result's columns from buffers in Python costs as much (each numpy or pyarrow call
 * is 5-20 us on these machines and a batch needs a dozen); imported through the C Data Interface
 * the whole batch is one call.
 *
 * Like _plain_few it answers only what it can vouch for: records whose texts are all ASCII keys
 * without a backslash (shown as stored: message.arrow_text), each candidate under one wanted
 * (topic, key) pair. Anything else (a record in the window that does not carry its pair's key
 * in its pair's topic: a hash collision or damage; a partition or size outside int32) returns
 * None and the general path answers, and checks, it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* The Arrow C Data Interface's array struct (its ABI is fixed: arrow/c/abi.h, no header here). */
struct ArrowArray {
    int64_t length, null_count, offset, n_buffers, n_children;
    const void **buffers;
    struct ArrowArray **children;
    struct ArrowArray *dictionary;
    void (*release)(struct ArrowArray *);
    void *private_data;
};

#define INT_FIELDS 7 /* _blocks.read_records' per-record columns (batch_format.RECORD_INT_FIELDS) */
enum { FLAGS, TOPIC, PARTITION, OFFSET, TIMESTAMP, COMMIT_LOG_OFFSET, SIZE };
#define FLAG_KEY 1
#define FLAG_LEAD 2

/* ROW_SCHEMA's columns (message.py), in its order */
enum { BROKER_COLUMN, TOPIC_COLUMN, PARTITION_COLUMN, OFFSET_COLUMN, KEY_COLUMN, KEYS_COLUMN, TIMESTAMP_COLUMN,
       COMMIT_LOG_OFFSET_COLUMN, SIZE_COLUMN, SEQ_COLUMN, COLUMNS };
#define OWNED_BUFFERS 32

/* Everything one batch holds: its arrays, their buffer lists and the buffers (freed together when
 * pyarrow releases the batch; a child's own release only marks it released). */
typedef struct {
    struct ArrowArray columns[COLUMNS], key_texts;
    struct ArrowArray *column_list[COLUMNS], *key_texts_list[1];
    const void *buffer_lists[COLUMNS + 2][3];
    void *owned[OWNED_BUFFERS];
    int owned_count, out_of_memory; /* (an allocation failed: the batch is never handed out) */
} batch_t;

/* (pyarrow's import never moves a child out of its batch, which the interface would allow: the
 * children's memory is the batch's, freed with it) */
static void release_child(struct ArrowArray *array) { array->release = NULL; }

static void release_batch(struct ArrowArray *array) {
    batch_t *batch = array->private_data;
    for (int i = 0; i < batch->owned_count; i++) free(batch->owned[i]);
    free(batch);
    array->release = NULL;
}

/* A zeroed buffer of `bytes` (at least 1: no null data pointers) the batch frees; NULL, and the
 * batch marked out of memory, when memory runs out. */
static void *owned_buffer(batch_t *batch, size_t bytes) {
    void *buffer = batch->owned_count < OWNED_BUFFERS ? calloc(bytes ? bytes : 1, 1) : NULL;
    if (buffer != NULL) batch->owned[batch->owned_count++] = buffer;
    else batch->out_of_memory = 1;
    return buffer;
}

static void set_array(struct ArrowArray *array, const void **buffer_list, int64_t length, int64_t null_count,
                      int64_t n_buffers) {
    memset(array, 0, sizeof *array);
    array->length = length, array->null_count = null_count, array->n_buffers = n_buffers;
    array->buffers = buffer_list;
    array->release = release_child;
}

static int int64_buffer(PyObject *object, Py_buffer *view) {
    if (PyObject_GetBuffer(object, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) != 0) return 0;
    if (view->itemsize != 8 || view->format == NULL || (strcmp(view->format, "l") != 0 && strcmp(view->format, "q") != 0)) {
        PyBuffer_Release(view);
        PyErr_SetString(PyExc_TypeError, "plain_rows: expected contiguous int64 arrays");
        return 0;
    }
    return 1;
}

/* What a record is ordered by: RESULT_ORDER (timestamp, topic as shown, partition, offset, seq). */
typedef struct {
    int64_t timestamp, partition, offset, seq, record;
    const uint8_t *topic;
    int64_t topic_length;
} order_t;

static int compare_order(const void *left, const void *right) {
    const order_t *a = left, *b = right;
    if (a->timestamp != b->timestamp) return a->timestamp < b->timestamp ? -1 : 1;
    int64_t shorter = a->topic_length < b->topic_length ? a->topic_length : b->topic_length;
    int bytes = memcmp(a->topic, b->topic, (size_t)shorter);
    if (bytes != 0) return bytes;
    if (a->topic_length != b->topic_length) return a->topic_length < b->topic_length ? -1 : 1;
    if (a->partition != b->partition) return a->partition < b->partition ? -1 : 1;
    if (a->offset != b->offset) return a->offset < b->offset ? -1 : 1;
    return a->seq < b->seq ? -1 : a->seq > b->seq;
}

static void set_valid(uint8_t *bitmap, int64_t row) { bitmap[row >> 3] |= (uint8_t)(1u << (row & 7)); }

/* plain_rows(ints, text_counts, heap, text_lengths, seqs, record_topics, record_pair_ends, record_pairs,
 *            wanted_topics, term_ends, terms, shown_topic_ends, shown_topics, broker, window, partitions,
 *            max_results, timestamp_bounds, no_value)
 *   -> None | (capsule, address, rows)
 * The records (read_records' outputs: `ints` records x INT_FIELDS, their text counts, their texts
 * back to back in `heap`, each text's length) at `seqs` (sorted); record r's topic is number
 * record_topics[r] among the flat list of topics whose shown names are `shown_topics`, cut at
 * `shown_topic_ends`; it was found under the wanted pairs record_pairs[record_pair_ends[r - 1] :
 * record_pair_ends[r]] (at least one). The wanted pairs are (topic, term) for each wanted topic,
 * then each term (`terms` cut at `term_ends`): pair p's topic is number wanted_topics[p / terms]
 * among the flat list (-1: none of the records'), its term number p % terms. `window`: (begin, end) ms, inclusive (INT64 bounds when open);
 * `partitions`: sorted wanted partitions, or None for all; max_results < 0: no limit;
 * timestamp_bounds: (MIN, MAX)_TIMESTAMP_MS, what a timestamp is shown clamped to; `no_value`: the
 * stored value of a commit-log offset or size the source did not have (shown null). The rows come
 * as a struct array of ROW_SCHEMA at `address`, for pyarrow.RecordBatch._import_from_c; the capsule
 * frees what an import did not take. */
static void free_unimported(PyObject *capsule) {
    struct ArrowArray *array = PyCapsule_GetPointer(capsule, "msgindex.result_rows");
    if (array == NULL) return;
    if (array->release != NULL) array->release(array);
    free(array);
}

#define INPUTS 11 /* the int64 arrays among the arguments */

static PyObject *plain_rows(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 19) {
        PyErr_SetString(PyExc_TypeError, "plain_rows takes 19 arguments");
        return NULL;
    }
    /* ints, text_counts, text_lengths, seqs, record_topics, record_pair_ends, record_pairs,
     * wanted_topics, term_ends, shown_topic_ends, partitions (the last may be None) */
    static const int int64_arguments[INPUTS] = {0, 1, 3, 4, 5, 6, 7, 8, 9, 11, 15};
    Py_buffer views[INPUTS], heap_view, terms_view, shown_view;
    int held = 0, bytes_held = 0;
    PyObject *result = NULL;
    for (; held < INPUTS; held++) {
        PyObject *argument = args[int64_arguments[held]];
        if (held == INPUTS - 1 && argument == Py_None) break;
        if (!int64_buffer(argument, &views[held])) goto done;
    }
    int has_partitions = held == INPUTS;
    if (PyObject_GetBuffer(args[2], &heap_view, PyBUF_C_CONTIGUOUS) != 0) goto done;
    bytes_held = 1;
    if (PyObject_GetBuffer(args[10], &terms_view, PyBUF_C_CONTIGUOUS) != 0) goto done;
    bytes_held = 2;
    if (PyObject_GetBuffer(args[12], &shown_view, PyBUF_C_CONTIGUOUS) != 0) goto done;
    bytes_held = 3;
    const char *broker;
    Py_ssize_t broker_length;
    long long begin, end, max_results, earliest, latest, no_value;
    if (PyBytes_AsStringAndSize(args[13], (char **)&broker, &broker_length) != 0 ||
        !PyArg_ParseTuple(args[14], "LL", &begin, &end) ||
        ((max_results = PyLong_AsLongLong(args[16])) == -1 && PyErr_Occurred()) ||
        !PyArg_ParseTuple(args[17], "LL", &earliest, &latest) ||
        ((no_value = PyLong_AsLongLong(args[18])) == -1 && PyErr_Occurred()))
        goto done;

    const int64_t *ints = views[0].buf, *text_counts = views[1].buf, *text_lengths = views[2].buf;
    const int64_t *seqs = views[3].buf, *record_topics = views[4].buf, *record_pair_ends = views[5].buf;
    const int64_t *record_pairs = views[6].buf, *wanted_topics = views[7].buf, *term_ends = views[8].buf;
    const int64_t *shown_ends = views[9].buf, *partitions = has_partitions ? views[10].buf : NULL;
    const uint8_t *heap = heap_view.buf, *terms = terms_view.buf, *shown = shown_view.buf;
    Py_ssize_t records = views[1].len / 8, texts = views[2].len / 8, term_count = views[8].len / 8;
    Py_ssize_t wanted_topic_count = views[7].len / 8, pairs = wanted_topic_count * term_count;
    Py_ssize_t record_pair_count = views[6].len / 8, topics = views[9].len / 8;
    Py_ssize_t partition_count = has_partitions ? views[10].len / 8 : 0;
    Py_ssize_t heap_length = heap_view.len;

    /* the arrays must fit one another: every cut inside what it cuts, every number in range */
    int consistent = views[0].len / 8 == records * INT_FIELDS && views[3].len / 8 == records &&
                     views[4].len / 8 == records && views[5].len / 8 == records;
    int64_t total = 0, counted = 0;
    for (Py_ssize_t t = 0; consistent && t < texts; t++)
        consistent = text_lengths[t] >= 0 && text_lengths[t] <= heap_length - total, total += text_lengths[t];
    for (Py_ssize_t r = 0; consistent && r < records; r++)
        consistent = text_counts[r] >= 0 && text_counts[r] <= texts - counted && record_topics[r] >= 0 &&
                     record_topics[r] < topics && record_pair_ends[r] > (r ? record_pair_ends[r - 1] : 0) &&
                     record_pair_ends[r] <= record_pair_count && (text_counts[r] > 0 || !(ints[r * INT_FIELDS] & FLAG_KEY)),
        counted += text_counts[r];
    for (Py_ssize_t i = 0; consistent && i < record_pair_count; i++) consistent = record_pairs[i] >= 0 && record_pairs[i] < pairs;
    for (Py_ssize_t w = 0; consistent && w < wanted_topic_count; w++)
        consistent = wanted_topics[w] >= -1 && wanted_topics[w] < topics;
    for (Py_ssize_t t = 0; consistent && t < term_count; t++)
        consistent = term_ends[t] >= (t ? term_ends[t - 1] : 0) && term_ends[t] <= terms_view.len;
    for (Py_ssize_t t = 0; consistent && t < topics; t++)
        consistent = shown_ends[t] >= (t ? shown_ends[t - 1] : 0) && shown_ends[t] <= shown_view.len;
    if (!consistent || total != heap_length || counted != texts) {
        PyErr_SetString(PyExc_ValueError, "plain_rows: arrays that do not fit one another");
        goto done;
    }
    /* texts shown as stored: ASCII, no backslash (else arrow_text rewrites some) */
    for (Py_ssize_t i = 0; i < heap_length; i++) {
        if (heap[i] >= 0x80 || heap[i] == '\\') {
            result = Py_NewRef(Py_None);
            goto done;
        }
    }

    order_t *matched = malloc(sizeof *matched * (size_t)(records ? records : 1));
    int64_t *first_text = malloc(sizeof *first_text * (size_t)(records + 1));
    int64_t *first_byte = malloc(sizeof *first_byte * (size_t)(texts + 1));
    if (matched == NULL || first_text == NULL || first_byte == NULL) {
        free(matched), free(first_text), free(first_byte);
        PyErr_NoMemory();
        goto done;
    }
    first_text[0] = 0, first_byte[0] = 0;
    for (Py_ssize_t r = 0; r < records; r++) first_text[r + 1] = first_text[r] + text_counts[r];
    for (Py_ssize_t t = 0; t < texts; t++) first_byte[t + 1] = first_byte[t] + text_lengths[t];
    int64_t kept = 0, key_texts = 0, key_bytes = 0, topic_bytes = 0;
    int plain = 1;
    for (Py_ssize_t r = 0; r < records && plain; r++) {
        const int64_t *fields = ints + r * INT_FIELDS;
        int64_t timestamp = fields[TIMESTAMP], partition = fields[PARTITION];
        if (timestamp < begin || timestamp > end) continue;
        if (has_partitions) {
            Py_ssize_t low = 0, high = partition_count;
            while (low < high) {
                Py_ssize_t middle = (low + high) / 2;
                if (partitions[middle] < partition) low = middle + 1;
                else high = middle;
            }
            if (low == partition_count || partitions[low] != partition) continue;
        }
        int64_t topic = record_topics[r], flags = fields[FLAGS];
        /* the record carries each of its pairs' keys in that pair's topic, or the general path answers */
        int64_t keys_from = first_text[r] + ((flags & FLAG_KEY) && !(flags & FLAG_LEAD) ? 1 : 0);
        int carried = 1;
        for (int64_t i = r ? record_pair_ends[r - 1] : 0; i < record_pair_ends[r] && carried; i++) {
            int64_t pair = record_pairs[i], term = pair % term_count;
            int64_t term_start = term ? term_ends[term - 1] : 0, term_length = term_ends[term] - term_start;
            carried = 0;
            for (int64_t text = keys_from; text < first_text[r + 1] && !carried && wanted_topics[pair / term_count] == topic;
                 text++)
                carried = text_lengths[text] == term_length &&
                          memcmp(heap + first_byte[text], terms + term_start, (size_t)term_length) == 0;
        }
        if (!carried || partition < INT32_MIN || partition > INT32_MAX ||
            (fields[SIZE] != no_value && (fields[SIZE] < INT32_MIN || fields[SIZE] > INT32_MAX))) {
            plain = 0;
            break;
        }
        int64_t topic_start = topic ? shown_ends[topic - 1] : 0;
        matched[kept++] = (order_t){timestamp, partition, fields[OFFSET], seqs[r], r, shown + topic_start,
                                    shown_ends[topic] - topic_start};
    }
    if (!plain) {
        free(matched), free(first_text), free(first_byte);
        result = Py_NewRef(Py_None);
        goto done;
    }
    qsort(matched, (size_t)kept, sizeof *matched, compare_order);
    if (max_results >= 0 && kept > max_results) kept = max_results;
    for (int64_t m = 0; m < kept; m++) {
        int64_t r = matched[m].record, flags = ints[r * INT_FIELDS + FLAGS];
        int64_t keys_from = first_text[r] + ((flags & FLAG_KEY) && !(flags & FLAG_LEAD) ? 1 : 0);
        key_texts += first_text[r + 1] - keys_from;
        key_bytes += first_byte[first_text[r + 1]] - first_byte[keys_from] +
                     ((flags & FLAG_KEY) ? text_lengths[first_text[r]] : 0);
        topic_bytes += matched[m].topic_length;
    }

    /* the batch: every buffer sized first, then filled row by row in result order */
    batch_t *batch = calloc(1, sizeof *batch);
    struct ArrowArray *exported = calloc(1, sizeof *exported);
    int64_t rows = kept, bitmap_bytes = (rows + 7) / 8;
    int32_t *broker_offsets = NULL, *topic_offsets = NULL, *key_offsets = NULL, *list_offsets = NULL, *text_offsets = NULL;
    int32_t *partition_values = NULL, *size_values = NULL;
    uint8_t *broker_data = NULL, *topic_data = NULL, *key_data = NULL, *text_data = NULL, *key_valid = NULL;
    uint8_t *commit_valid = NULL, *size_valid = NULL;
    int64_t *offset_values = NULL, *timestamp_values = NULL, *commit_values = NULL, *seq_values = NULL;
    int fits = rows * broker_length <= INT32_MAX && topic_bytes <= INT32_MAX && key_bytes <= INT32_MAX &&
               key_texts <= INT32_MAX;
    if (batch != NULL && exported != NULL && fits) {
        broker_offsets = owned_buffer(batch, 4 * (size_t)(rows + 1));
        broker_data = owned_buffer(batch, (size_t)(rows * broker_length));
        topic_offsets = owned_buffer(batch, 4 * (size_t)(rows + 1));
        topic_data = owned_buffer(batch, (size_t)topic_bytes);
        partition_values = owned_buffer(batch, 4 * (size_t)rows);
        offset_values = owned_buffer(batch, 8 * (size_t)rows);
        key_valid = owned_buffer(batch, (size_t)bitmap_bytes);
        key_offsets = owned_buffer(batch, 4 * (size_t)(rows + 1));
        key_data = owned_buffer(batch, (size_t)key_bytes); /* (keys and texts share nothing: two buffers) */
        list_offsets = owned_buffer(batch, 4 * (size_t)(rows + 1));
        text_offsets = owned_buffer(batch, 4 * (size_t)(key_texts + 1));
        text_data = owned_buffer(batch, (size_t)key_bytes);
        timestamp_values = owned_buffer(batch, 8 * (size_t)rows);
        commit_valid = owned_buffer(batch, (size_t)bitmap_bytes);
        commit_values = owned_buffer(batch, 8 * (size_t)rows);
        size_valid = owned_buffer(batch, (size_t)bitmap_bytes);
        size_values = owned_buffer(batch, 4 * (size_t)rows);
        seq_values = owned_buffer(batch, 8 * (size_t)rows);
    }
    if (batch == NULL || exported == NULL || !fits || batch->out_of_memory) {
        if (batch != NULL) {
            for (int i = 0; i < batch->owned_count; i++) free(batch->owned[i]);
            free(batch);
        }
        free(exported), free(matched), free(first_text), free(first_byte);
        if (fits) PyErr_NoMemory();
        else result = Py_NewRef(Py_None); /* (an answer past 2 GiB of text: the general path's) */
        goto done;
    }
    int64_t key_nulls = 0, commit_nulls = 0, size_nulls = 0, text_count = 0;
    int32_t topic_at = 0, key_at = 0, text_at = 0;
    for (int64_t m = 0; m < rows; m++) {
        int64_t r = matched[m].record;
        const int64_t *fields = ints + r * INT_FIELDS;
        int64_t flags = fields[FLAGS];
        memcpy(broker_data + m * broker_length, broker, (size_t)broker_length);
        broker_offsets[m + 1] = (int32_t)((m + 1) * broker_length);
        memcpy(topic_data + topic_at, matched[m].topic, (size_t)matched[m].topic_length);
        topic_offsets[m + 1] = topic_at += (int32_t)matched[m].topic_length;
        partition_values[m] = (int32_t)fields[PARTITION];
        offset_values[m] = fields[OFFSET];
        if (flags & FLAG_KEY) {
            int64_t key = first_text[r];
            memcpy(key_data + key_at, heap + first_byte[key], (size_t)text_lengths[key]);
            key_at += (int32_t)text_lengths[key];
            set_valid(key_valid, m);
        } else {
            key_nulls++;
        }
        key_offsets[m + 1] = key_at;
        int64_t keys_from = first_text[r] + ((flags & FLAG_KEY) && !(flags & FLAG_LEAD) ? 1 : 0);
        for (int64_t text = keys_from; text < first_text[r + 1]; text++) {
            memcpy(text_data + text_at, heap + first_byte[text], (size_t)text_lengths[text]);
            text_offsets[++text_count] = text_at += (int32_t)text_lengths[text];
        }
        list_offsets[m + 1] = (int32_t)text_count;
        int64_t timestamp = fields[TIMESTAMP] < earliest ? earliest : fields[TIMESTAMP] > latest ? latest : fields[TIMESTAMP];
        timestamp_values[m] = timestamp * 1000;
        if (fields[COMMIT_LOG_OFFSET] == no_value) commit_nulls++;
        else set_valid(commit_valid, m), commit_values[m] = fields[COMMIT_LOG_OFFSET];
        if (fields[SIZE] == no_value) size_nulls++;
        else set_valid(size_valid, m), size_values[m] = (int32_t)fields[SIZE];
        seq_values[m] = matched[m].seq;
    }
    free(matched), free(first_text), free(first_byte);

    const void **lists[COLUMNS + 2];
    for (int i = 0; i < COLUMNS + 2; i++) lists[i] = batch->buffer_lists[i];
    lists[BROKER_COLUMN][1] = broker_offsets, lists[BROKER_COLUMN][2] = broker_data;
    lists[TOPIC_COLUMN][1] = topic_offsets, lists[TOPIC_COLUMN][2] = topic_data;
    lists[PARTITION_COLUMN][1] = partition_values;
    lists[OFFSET_COLUMN][1] = offset_values;
    lists[KEY_COLUMN][0] = key_nulls ? key_valid : NULL, lists[KEY_COLUMN][1] = key_offsets, lists[KEY_COLUMN][2] = key_data;
    lists[KEYS_COLUMN][1] = list_offsets;
    lists[TIMESTAMP_COLUMN][1] = timestamp_values;
    lists[COMMIT_LOG_OFFSET_COLUMN][0] = commit_nulls ? commit_valid : NULL, lists[COMMIT_LOG_OFFSET_COLUMN][1] = commit_values;
    lists[SIZE_COLUMN][0] = size_nulls ? size_valid : NULL, lists[SIZE_COLUMN][1] = size_values;
    lists[SEQ_COLUMN][1] = seq_values;
    lists[COLUMNS][1] = text_offsets, lists[COLUMNS][2] = text_data; /* the keys' texts */
    static const int64_t buffers_of[COLUMNS] = {3, 3, 2, 2, 3, 2, 2, 2, 2, 2};
    const int64_t nulls_of[COLUMNS] = {0, 0, 0, 0, key_nulls, 0, 0, commit_nulls, size_nulls, 0};
    for (int i = 0; i < COLUMNS; i++) {
        set_array(&batch->columns[i], lists[i], rows, nulls_of[i], buffers_of[i]);
        batch->column_list[i] = &batch->columns[i];
    }
    set_array(&batch->key_texts, lists[COLUMNS], text_count, 0, 3);
    batch->key_texts_list[0] = &batch->key_texts;
    batch->columns[KEYS_COLUMN].n_children = 1, batch->columns[KEYS_COLUMN].children = batch->key_texts_list;
    set_array(exported, lists[COLUMNS + 1], rows, 0, 1); /* the struct: no validity of its own */
    exported->n_children = COLUMNS, exported->children = batch->column_list;
    exported->release = release_batch, exported->private_data = batch;
    PyObject *capsule = PyCapsule_New(exported, "msgindex.result_rows", free_unimported);
    if (capsule == NULL) {
        release_batch(exported);
        free(exported);
        goto done;
    }
    result = Py_BuildValue("(NKL)", capsule, (unsigned long long)(uintptr_t)exported, (long long)rows);

done:
    for (int i = 0; i < held; i++) PyBuffer_Release(&views[i]);
    if (bytes_held >= 1) PyBuffer_Release(&heap_view);
    if (bytes_held >= 2) PyBuffer_Release(&terms_view);
    if (bytes_held >= 3) PyBuffer_Release(&shown_view);
    return result;
}

static PyMethodDef methods[] = {
    {"plain_rows", (PyCFunction)(void (*)(void))plain_rows, METH_FASTCALL,
     "plain_rows(...): a point read's verified rows as an Arrow struct array (see the module's source); None "
     "where the general path must answer."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_result_rows", "A point read's result rows built in C (see verified_reads.py).", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__result_rows(void) { return PyModule_Create(&module_def); }
