#include "services/engine/safetensors.h"

#include "common/alloc.h"
#include "common/json.h"
#include "kernels/cpu/quant.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors data is little-endian; this reader converts by memcpy"
#endif

/* Headers above this are refused outright (the 96k-tensor release header is ~10 MB). */
#define HEADER_MAX ((uint64_t)100 * 1000 * 1000)
/* The index json of a sharded checkpoint. */
#define INDEX_MAX ((size_t)256 * 1024 * 1024)
/* Largest integer a JSON number (a double in cJSON) holds exactly. */
#define JSON_INT_MAX 9007199254740992.0

/* ---- dtypes ------------------------------------------------------------------------------ */

static const struct {
    const char *name;
    size_t size;
} dtype_info[] = {
    [BT_DTYPE_F32] = {"F32", 4},        [BT_DTYPE_F16] = {"F16", 2},
    [BT_DTYPE_BF16] = {"BF16", 2},      [BT_DTYPE_F64] = {"F64", 8},
    [BT_DTYPE_F8_E4M3] = {"F8_E4M3", 1}, [BT_DTYPE_F8_E8M0] = {"F8_E8M0", 1},
    [BT_DTYPE_I8] = {"I8", 1},          [BT_DTYPE_U8] = {"U8", 1},
    [BT_DTYPE_I16] = {"I16", 2},        [BT_DTYPE_I32] = {"I32", 4},
    [BT_DTYPE_I64] = {"I64", 8},        [BT_DTYPE_BOOL] = {"BOOL", 1},
};
#define N_DTYPES (sizeof dtype_info / sizeof dtype_info[0])

const char *bt_safetensors_dtype_name(bt_dtype_t dtype)
{
    return (unsigned)dtype < N_DTYPES ? dtype_info[dtype].name : "?";
}

size_t bt_safetensors_dtype_size(bt_dtype_t dtype)
{
    return (unsigned)dtype < N_DTYPES ? dtype_info[dtype].size : 0;
}

int bt_safetensors_dtype_parse(const char *name, bt_dtype_t *dtype_p)
{
    for (size_t i = 0; i < N_DTYPES; i++) {
        if (!strcmp(name, dtype_info[i].name)) {
            *dtype_p = (bt_dtype_t)i;
            return 0;
        }
    }
    return -1;
}

/* ---- the object -------------------------------------------------------------------------- */

typedef struct {
    char *path;          /* as opened; views point at it */
    const uint8_t *base; /* the whole file image */
    size_t len;
    int mapped; /* munmap at close (else caller memory) */
} st_file_t;

struct bt_safetensors {
    char *label; /* the file or directory opened, for messages */
    st_file_t *files;
    size_t n_files, cap_files;
    bt_tensor_view_t *tensors;
    size_t n_tensors, cap_tensors;
    size_t *slots; /* open addressing: tensor index + 1, 0 = empty */
    size_t n_slots;
};

static bt_status_t fail(char *err, size_t errlen, bt_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static bt_status_t fail(char *err, size_t errlen, bt_status_t st, const char *fmt, ...)
{
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return st;
}

static uint64_t hash_name(const char *s)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; s++) {
        h ^= (unsigned char)*s;
        h *= 1099511628211ull;
    }
    return h;
}

/* Index of `name` among the tensors, or SIZE_MAX. */
static size_t lookup(const bt_safetensors_t *st, const char *name)
{
    if (!st->n_slots) return SIZE_MAX;
    size_t mask = st->n_slots - 1;
    for (size_t i = (size_t)hash_name(name) & mask;; i = (i + 1) & mask) {
        size_t v = st->slots[i];
        if (!v) return SIZE_MAX;
        if (!strcmp(st->tensors[v - 1].name, name)) return v - 1;
    }
}

static void slot_insert(size_t *slots, size_t n_slots, const char *name, size_t index)
{
    size_t mask = n_slots - 1;
    size_t i = (size_t)hash_name(name) & mask;
    while (slots[i]) i = (i + 1) & mask;
    slots[i] = index + 1;
}

/* Keeps the table at most half full. */
static void index_reserve(bt_safetensors_t *st, size_t n)
{
    if (2 * n <= st->n_slots) return;
    size_t want = st->n_slots ? st->n_slots : 64;
    while (want < 2 * n) want *= 2;
    size_t *slots = bt_calloc_or_die(want, sizeof *slots);
    for (size_t i = 0; i < st->n_tensors; i++)
        slot_insert(slots, want, st->tensors[i].name, i);
    free(st->slots);
    st->slots = slots;
    st->n_slots = want;
}

static bt_safetensors_t *st_new(const char *label)
{
    bt_safetensors_t *st = bt_calloc_or_die(1, sizeof *st);
    st->label = bt_strdup_or_die(label);
    return st;
}

void bt_safetensors_close(bt_safetensors_t *st)
{
    if (!st) return;
    for (size_t i = 0; i < st->n_tensors; i++) free((char *)st->tensors[i].name);
    for (size_t i = 0; i < st->n_files; i++) {
        if (st->files[i].mapped) munmap((void *)st->files[i].base, st->files[i].len);
        free(st->files[i].path);
    }
    free(st->tensors);
    free(st->files);
    free(st->slots);
    free(st->label);
    free(st);
}

/* Takes ownership of the mapping (when `mapped`) even on failure: close releases it. */
static size_t st_add_file(bt_safetensors_t *st, const char *path, const uint8_t *base, size_t len,
                          int mapped)
{
    if (st->n_files == st->cap_files) {
        st->cap_files = st->cap_files ? 2 * st->cap_files : 4;
        st->files = bt_realloc_or_die(st->files, st->cap_files * sizeof *st->files);
    }
    st_file_t *f = &st->files[st->n_files];
    f->path = bt_strdup_or_die(path);
    f->base = base;
    f->len = len;
    f->mapped = mapped;
    return st->n_files++;
}

/* ---- header parsing ---------------------------------------------------------------------- */

/* A JSON number that is a whole number in [0, 2^53]. */
static int json_uint(const cJSON *v, uint64_t *out)
{
    if (!cJSON_IsNumber(v)) return -1;
    double d = v->valuedouble;
    if (!(d >= 0.0) || d > JSON_INT_MAX || floor(d) != d) return -1;
    *out = (uint64_t)d;
    return 0;
}

static bt_status_t parse_entry(bt_safetensors_t *st, const st_file_t *f, const cJSON *entry,
                               const uint8_t *data, size_t data_len, char *err, size_t errlen)
{
    const char *path = f->path;
    const char *name = entry->string;
    if (!name || !*name) return fail(err, errlen, BT_ERR_BAD_CHECKPOINT, "%s: empty tensor name", path);
    if (!cJSON_IsObject(entry))
        return fail(err, errlen, BT_ERR_BAD_CHECKPOINT, "%s: tensor '%s': entry is not an object",
                    path, name);

    const cJSON *jd = cJSON_GetObjectItemCaseSensitive(entry, "dtype");
    const cJSON *js = cJSON_GetObjectItemCaseSensitive(entry, "shape");
    const cJSON *jo = cJSON_GetObjectItemCaseSensitive(entry, "data_offsets");
    bt_dtype_t dtype;
    if (!cJSON_IsString(jd) || !jd->valuestring)
        return fail(err, errlen, BT_ERR_BAD_CHECKPOINT, "%s: tensor '%s': missing string 'dtype'",
                    path, name);
    if (bt_safetensors_dtype_parse(jd->valuestring, &dtype))
        return fail(err, errlen, BT_ERR_BAD_CHECKPOINT, "%s: tensor '%s': unknown dtype '%.32s'",
                    path, name, jd->valuestring);

    if (!cJSON_IsArray(js))
        return fail(err, errlen, BT_ERR_BAD_CHECKPOINT, "%s: tensor '%s': missing array 'shape'",
                    path, name);
    int ndim = cJSON_GetArraySize(js);
    if (ndim > BT_SAFETENSORS_MAX_DIMS)
        return fail(err, errlen, BT_ERR_BAD_CHECKPOINT, "%s: tensor '%s': %d dims (at most %d)",
                    path, name, ndim, BT_SAFETENSORS_MAX_DIMS);
    int64_t shape[BT_SAFETENSORS_MAX_DIMS] = {0};
    size_t count = 1;
    int d = 0;
    for (const cJSON *v = js->child; v; v = v->next, d++) {
        uint64_t dim;
        if (json_uint(v, &dim))
            return fail(err, errlen, BT_ERR_BAD_CHECKPOINT,
                        "%s: tensor '%s': shape[%d] is not a non-negative integer", path, name, d);
        if (bt_mul_overflows(count, (size_t)dim, &count))
            return fail(err, errlen, BT_ERR_BAD_CHECKPOINT,
                        "%s: tensor '%s': shape overflows the element count", path, name);
        shape[d] = (int64_t)dim;
    }
    size_t nbytes;
    if (bt_mul_overflows(count, dtype_info[dtype].size, &nbytes))
        return fail(err, errlen, BT_ERR_BAD_CHECKPOINT,
                    "%s: tensor '%s': shape overflows the byte count", path, name);

    uint64_t begin, end;
    if (!cJSON_IsArray(jo) || cJSON_GetArraySize(jo) != 2 || json_uint(jo->child, &begin) ||
        json_uint(jo->child->next, &end) || begin > end)
        return fail(err, errlen, BT_ERR_BAD_CHECKPOINT,
                    "%s: tensor '%s': 'data_offsets' is not [begin, end] with 0 <= begin <= end",
                    path, name);
    if (end > data_len)
        return fail(err, errlen, BT_ERR_BAD_CHECKPOINT,
                    "%s: tensor '%s': data_offsets end %" PRIu64
                    " is past the data section (%zu bytes)",
                    path, name, end, data_len);
    if (end - begin != nbytes)
        return fail(err, errlen, BT_ERR_BAD_CHECKPOINT,
                    "%s: tensor '%s': %" PRIu64 " bytes stored, shape and dtype %s need %zu", path,
                    name, end - begin, dtype_info[dtype].name, nbytes);

    if (lookup(st, name) != SIZE_MAX) {
        const bt_tensor_view_t *prev = &st->tensors[lookup(st, name)];
        return fail(err, errlen, BT_ERR_BAD_CHECKPOINT, "%s: tensor '%s' appears twice (also in %s)",
                    path, name, prev->file);
    }
    if (st->n_tensors == st->cap_tensors) {
        st->cap_tensors = st->cap_tensors ? 2 * st->cap_tensors : 64;
        st->tensors = bt_realloc_or_die(st->tensors, st->cap_tensors * sizeof *st->tensors);
    }
    index_reserve(st, st->n_tensors + 1);
    bt_tensor_view_t *t = &st->tensors[st->n_tensors];
    memset(t, 0, sizeof *t);
    t->name = bt_strdup_or_die(name);
    t->dtype = dtype;
    t->ndim = ndim;
    memcpy(t->shape, shape, sizeof shape);
    t->data = data + begin;
    t->nbytes = nbytes;
    t->file = f->path;
    slot_insert(st->slots, st->n_slots, t->name, st->n_tensors);
    st->n_tensors++;
    return BT_OK;
}

/* Parses the image of file `fi` (already added to st) and appends its tensors. */
static bt_status_t parse_image(bt_safetensors_t *st, size_t fi, char *err, size_t errlen)
{
    const st_file_t *f = &st->files[fi];
    const char *path = f->path;
    if (f->len < 8)
        return fail(err, errlen, BT_ERR_BAD_CHECKPOINT,
                    "%s: %zu bytes, shorter than the 8-byte header length", path, f->len);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | f->base[i];
    if (hlen > HEADER_MAX)
        return fail(err, errlen, BT_ERR_BAD_CHECKPOINT,
                    "%s: header length %" PRIu64 " is absurd (limit %" PRIu64 ")", path, hlen,
                    HEADER_MAX);
    if (hlen > f->len - 8)
        return fail(err, errlen, BT_ERR_BAD_CHECKPOINT,
                    "%s: header length %" PRIu64 " runs past the end of the file (%zu bytes)",
                    path, hlen, f->len);

    /* cJSON wants a terminated string: parse a copy. */
    char *text = bt_malloc_or_die((size_t)hlen + 1);
    memcpy(text, f->base + 8, (size_t)hlen);
    text[hlen] = '\0';
    const char *stop = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, (size_t)hlen, &stop, 0);
    bt_status_t st_rc = BT_OK;
    if (!root) {
        size_t off = stop && stop >= text ? (size_t)(stop - text) : 0;
        st_rc = fail(err, errlen, BT_ERR_BAD_CHECKPOINT, "%s: header is not valid JSON (near byte %zu)",
                     path, off);
        goto out_text;
    }
    for (const char *p = stop ? stop : text + hlen; p < text + hlen; p++) {
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            st_rc = fail(err, errlen, BT_ERR_BAD_CHECKPOINT,
                         "%s: header has trailing bytes after the JSON object (byte %zu)", path,
                         (size_t)(p - text));
            goto out_root;
        }
    }
    if (!cJSON_IsObject(root)) {
        st_rc = fail(err, errlen, BT_ERR_BAD_CHECKPOINT, "%s: header is not a JSON object", path);
        goto out_root;
    }

    const uint8_t *data = f->base + 8 + hlen;
    size_t data_len = f->len - 8 - (size_t)hlen;
    for (const cJSON *e = root->child; e; e = e->next) {
        if (e->string && !strcmp(e->string, "__metadata__")) {
            if (!cJSON_IsObject(e)) {
                st_rc = fail(err, errlen, BT_ERR_BAD_CHECKPOINT,
                             "%s: '__metadata__' is not an object", path);
                goto out_root;
            }
            continue;
        }
        st_rc = parse_entry(st, f, e, data, data_len, err, errlen);
        if (st_rc != BT_OK) goto out_root;
    }

out_root:
    cJSON_Delete(root);
out_text:
    free(text);
    return st_rc;
}

/* Maps `path` and parses it into st. */
static bt_status_t add_path(bt_safetensors_t *st, const char *path, char *err, size_t errlen)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        return fail(err, errlen, e == ENOENT ? BT_ERR_NOT_FOUND : BT_ERR_IO, "%s: %s", path,
                    strerror(e));
    }
    struct stat sb;
    bt_status_t rc = BT_OK;
    if (fstat(fd, &sb) != 0) {
        rc = fail(err, errlen, BT_ERR_IO, "%s: %s", path, strerror(errno));
        goto out_fd;
    }
    if (!S_ISREG(sb.st_mode)) {
        rc = fail(err, errlen, BT_ERR_BAD_CHECKPOINT, "%s: not a regular file", path);
        goto out_fd;
    }
    if ((uint64_t)sb.st_size > SIZE_MAX) {
        rc = fail(err, errlen, BT_ERR_BAD_CHECKPOINT, "%s: too large to map", path);
        goto out_fd;
    }
    size_t len = (size_t)sb.st_size;
    if (len < 8) {
        rc = fail(err, errlen, BT_ERR_BAD_CHECKPOINT,
                  "%s: %zu bytes, shorter than the 8-byte header length", path, len);
        goto out_fd;
    }
    void *base = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
    if (base == MAP_FAILED) {
        rc = fail(err, errlen, BT_ERR_IO, "%s: mmap: %s", path, strerror(errno));
        goto out_fd;
    }
    size_t fi = st_add_file(st, path, base, len, 1);
    rc = parse_image(st, fi, err, errlen);
out_fd:
    close(fd);
    return rc;
}

bt_status_t bt_safetensors_open(const char *path, bt_safetensors_t **st_p, char *err,
                                size_t errlen)
{
    if (!path || !st_p) return fail(err, errlen, BT_ERR_INVALID_ARG, "safetensors: no path");
    bt_safetensors_t *st = st_new(path);
    bt_status_t rc = add_path(st, path, err, errlen);
    if (rc != BT_OK) {
        bt_safetensors_close(st);
        return rc;
    }
    *st_p = st;
    return BT_OK;
}

bt_status_t bt_safetensors_open_memory(const uint8_t *data, size_t len, const char *label,
                                       bt_safetensors_t **st_p, char *err, size_t errlen)
{
    if ((!data && len) || !st_p) return fail(err, errlen, BT_ERR_INVALID_ARG, "safetensors: no data");
    if (!label) label = "<memory>";
    bt_safetensors_t *st = st_new(label);
    size_t fi = st_add_file(st, label, data, len, 0);
    bt_status_t rc = parse_image(st, fi, err, errlen);
    if (rc != BT_OK) {
        bt_safetensors_close(st);
        return rc;
    }
    *st_p = st;
    return BT_OK;
}

/* ---- directories and sharded checkpoints ------------------------------------------------- */

static char *path_join(const char *dir, const char *name)
{
    size_t a = strlen(dir), b = strlen(name);
    int slash = a > 0 && dir[a - 1] != '/';
    char *p = bt_malloc_or_die(a + slash + b + 1);
    memcpy(p, dir, a);
    if (slash) p[a] = '/';
    memcpy(p + a + slash, name, b + 1);
    return p;
}

static int plain_file_name(const char *s)
{
    return *s && !strchr(s, '/') && !strchr(s, '\\') && strcmp(s, ".") && strcmp(s, "..");
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static bt_status_t open_index(bt_safetensors_t *st, const char *dir, const char *index_path,
                              const cJSON *root, char *err, size_t errlen)
{
    const cJSON *map = cJSON_IsObject(root) ? cJSON_GetObjectItemCaseSensitive(root, "weight_map")
                                            : NULL;
    if (!cJSON_IsObject(map))
        return fail(err, errlen, BT_ERR_BAD_CHECKPOINT, "%s: no object 'weight_map'", index_path);

    size_t n = 0;
    for (const cJSON *e = map->child; e; e = e->next) n++;
    const char **shards = bt_calloc_or_die(n ? n : 1, sizeof *shards);
    bt_status_t rc = BT_OK;
    size_t k = 0;
    for (const cJSON *e = map->child; e; e = e->next) {
        const char *tname = e->string ? e->string : "";
        if (!cJSON_IsString(e) || !e->valuestring) {
            rc = fail(err, errlen, BT_ERR_BAD_CHECKPOINT,
                      "%s: tensor '%s': shard is not a string", index_path, tname);
            goto out;
        }
        if (!plain_file_name(e->valuestring)) {
            rc = fail(err, errlen, BT_ERR_BAD_CHECKPOINT,
                      "%s: tensor '%s': shard '%.200s' is not a plain file name", index_path,
                      tname, e->valuestring);
            goto out;
        }
        shards[k++] = e->valuestring;
    }
    qsort(shards, k, sizeof *shards, cmp_str);
    for (size_t i = 0; i < k; i++) {
        if (i > 0 && !strcmp(shards[i], shards[i - 1])) continue;
        char *path = path_join(dir, shards[i]);
        rc = add_path(st, path, err, errlen);
        if (rc == BT_ERR_NOT_FOUND)
            rc = fail(err, errlen, BT_ERR_BAD_CHECKPOINT, "%s: shard %s is missing", index_path,
                      path);
        free(path);
        if (rc != BT_OK) goto out;
    }
    /* Every mapped tensor must be where the index says. */
    for (const cJSON *e = map->child; e; e = e->next) {
        size_t i = lookup(st, e->string);
        if (i == SIZE_MAX) {
            rc = fail(err, errlen, BT_ERR_BAD_CHECKPOINT,
                      "%s: tensor '%s' is not in its shard %s", index_path, e->string,
                      e->valuestring);
            goto out;
        }
        const char *file = st->tensors[i].file;
        const char *base = strrchr(file, '/');
        base = base ? base + 1 : file;
        if (strcmp(base, e->valuestring)) {
            rc = fail(err, errlen, BT_ERR_BAD_CHECKPOINT,
                      "%s: tensor '%s' is mapped to %s but found in %s", index_path, e->string,
                      e->valuestring, file);
            goto out;
        }
    }
out:
    free(shards);
    return rc;
}

bt_status_t bt_safetensors_open_dir(const char *dir, bt_safetensors_t **st_p, char *err,
                                    size_t errlen)
{
    if (!dir || !st_p) return fail(err, errlen, BT_ERR_INVALID_ARG, "safetensors: no directory");
    char *index_path = path_join(dir, "model.safetensors.index.json");
    char *single_path = path_join(dir, "model.safetensors");
    bt_safetensors_t *st = st_new(dir);
    cJSON *root = NULL;
    char jerr[256] = "";
    bt_status_t rc = bt_json_read_file(index_path, INDEX_MAX, &root, jerr, sizeof jerr);
    if (rc == BT_OK) {
        rc = open_index(st, dir, index_path, root, err, errlen);
        cJSON_Delete(root);
    } else if (rc == BT_ERR_NOT_FOUND) {
        rc = add_path(st, single_path, err, errlen);
        if (rc == BT_ERR_NOT_FOUND)
            rc = fail(err, errlen, BT_ERR_NOT_FOUND,
                      "%s: no model.safetensors or model.safetensors.index.json", dir);
    } else {
        rc = fail(err, errlen, rc == BT_ERR_IO ? BT_ERR_IO : BT_ERR_BAD_CHECKPOINT, "%s", jerr);
    }
    free(index_path);
    free(single_path);
    if (rc != BT_OK) {
        bt_safetensors_close(st);
        return rc;
    }
    *st_p = st;
    return BT_OK;
}

/* ---- lookups ----------------------------------------------------------------------------- */

const bt_tensor_view_t *bt_safetensors_find(const bt_safetensors_t *st, const char *name)
{
    if (!st || !name) return NULL;
    size_t i = lookup(st, name);
    return i == SIZE_MAX ? NULL : &st->tensors[i];
}

size_t bt_safetensors_count(const bt_safetensors_t *st)
{
    return st ? st->n_tensors : 0;
}

const bt_tensor_view_t *bt_safetensors_at(const bt_safetensors_t *st, size_t i)
{
    return st && i < st->n_tensors ? &st->tensors[i] : NULL;
}

/* ---- float reads ------------------------------------------------------------------------- */

static void format_shape(char *buf, size_t len, int ndim, const int64_t *shape)
{
    size_t o = 0;
    o += (size_t)snprintf(buf + o, len - o, "[");
    for (int i = 0; i < ndim && o < len; i++)
        o += (size_t)snprintf(buf + o, len - o, "%s%" PRId64, i ? ", " : "", shape[i]);
    if (o < len) snprintf(buf + o, len - o, "]");
}

static bt_status_t shape_mismatch(const bt_tensor_view_t *t, int ndim, const int64_t *shape,
                                  const char *what, char *err, size_t errlen)
{
    char have[160], want[160];
    format_shape(have, sizeof have, t->ndim, t->shape);
    format_shape(want, sizeof want, ndim, shape);
    return fail(err, errlen, BT_ERR_BAD_CHECKPOINT, "%s: tensor '%s' (%s) has shape %s, %s %s",
                t->file, t->name, bt_safetensors_dtype_name(t->dtype), have, what, want);
}

static int same_shape(const bt_tensor_view_t *t, int ndim, const int64_t *shape)
{
    if (t->ndim != ndim) return 0;
    for (int i = 0; i < ndim; i++)
        if (t->shape[i] != shape[i]) return 0;
    return 1;
}

/* The `.scale` companion of a quantized tensor: F8_E8M0, 2-D. */
static bt_status_t find_scale(const bt_safetensors_t *st, const bt_tensor_view_t *t,
                              const bt_tensor_view_t **scale_p, char *err, size_t errlen)
{
    const char *name = t->name;
    size_t n = strlen(name);
    const char *suffix = ".weight";
    size_t sl = strlen(suffix);
    size_t prefix = n >= sl && !strcmp(name + n - sl, suffix) ? n - sl : n;
    char *sname = bt_malloc_or_die(prefix + sizeof ".scale");
    memcpy(sname, name, prefix);
    memcpy(sname + prefix, ".scale", sizeof ".scale");
    const bt_tensor_view_t *s = bt_safetensors_find(st, sname);
    bt_status_t rc = BT_OK;
    if (!s)
        rc = fail(err, errlen, BT_ERR_BAD_CHECKPOINT, "%s: tensor '%s' (%s) has no scale '%s'",
                  t->file, name, bt_safetensors_dtype_name(t->dtype), sname);
    else if (s->dtype != BT_DTYPE_F8_E8M0 || s->ndim != 2)
        rc = fail(err, errlen, BT_ERR_BAD_CHECKPOINT,
                  "%s: scale '%s' of tensor '%s' is %s with %d dims, expected 2-D F8_E8M0",
                  s->file, sname, name, bt_safetensors_dtype_name(s->dtype), s->ndim);
    free(sname);
    if (rc == BT_OK) *scale_p = s;
    return rc;
}

static void scale_table(float lut[256])
{
    for (int i = 0; i < 256; i++) lut[i] = bt_e8m0_to_f32((uint8_t)i);
}

bt_status_t bt_safetensors_read_f32(const bt_safetensors_t *st, const char *name, int ndim,
                                    const int64_t *shape, float *out, char *err, size_t errlen)
{
    if (!st || !name || ndim < 0 || ndim > BT_SAFETENSORS_MAX_DIMS || (ndim && !shape))
        return fail(err, errlen, BT_ERR_INVALID_ARG, "safetensors read: bad arguments");
    size_t count = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0 || bt_mul_overflows(count, (size_t)shape[i], &count))
            return fail(err, errlen, BT_ERR_INVALID_ARG,
                        "safetensors read '%s': bad expected shape", name);
    }
    if (count && !out) return fail(err, errlen, BT_ERR_INVALID_ARG, "safetensors read: no output");

    const bt_tensor_view_t *t = bt_safetensors_find(st, name);
    if (!t)
        return fail(err, errlen, BT_ERR_BAD_CHECKPOINT, "%s: tensor '%s' not found", st->label,
                    name);

    const uint8_t *p = t->data;
    switch (t->dtype) {
    case BT_DTYPE_F32:
    case BT_DTYPE_F16:
    case BT_DTYPE_BF16:
    case BT_DTYPE_F64:
    case BT_DTYPE_F8_E4M3:
        if (!same_shape(t, ndim, shape))
            return shape_mismatch(t, ndim, shape, "expected", err, errlen);
        break;
    case BT_DTYPE_I8: {
        /* packed FP4: the stored last dim is half the logical one */
        int ok = ndim >= 1 && t->ndim == ndim && shape[ndim - 1] % 2 == 0 &&
                 t->shape[ndim - 1] * 2 == shape[ndim - 1];
        for (int i = 0; ok && i < ndim - 1; i++) ok = t->shape[i] == shape[i];
        if (!ok)
            return shape_mismatch(t, ndim, shape, "expected (packed FP4, last dim halved) for",
                                  err, errlen);
        break;
    }
    default:
        return fail(err, errlen, BT_ERR_BAD_CHECKPOINT,
                    "%s: tensor '%s' has dtype %s, which has no float32 reading", t->file, t->name,
                    bt_safetensors_dtype_name(t->dtype));
    }

    switch (t->dtype) {
    case BT_DTYPE_F32:
        if (count) memcpy(out, p, count * 4);
        return BT_OK;
    case BT_DTYPE_F16:
    case BT_DTYPE_BF16:
        for (size_t i = 0; i < count; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            out[i] = t->dtype == BT_DTYPE_F16 ? bt_f16_to_f32(h) : bt_bf16_to_f32(h);
        }
        return BT_OK;
    case BT_DTYPE_F64:
        for (size_t i = 0; i < count; i++) {
            double v;
            memcpy(&v, p + 8 * i, 8);
            out[i] = (float)v;
        }
        return BT_OK;
    default:
        break;
    }

    /* Quantized: rows x cols with a 2-D scale. */
    size_t cols = ndim ? (size_t)shape[ndim - 1] : 1;
    size_t rows = 1;
    for (int i = 0; i + 1 < ndim; i++) rows *= (size_t)shape[i];
    size_t cblocks = (cols + 31) / 32;
    const bt_tensor_view_t *s;
    bt_status_t rc = find_scale(st, t, &s, err, errlen);
    if (rc != BT_OK) return rc;
    float lut[256];
    scale_table(lut);

    if (t->dtype == BT_DTYPE_F8_E4M3) {
        int64_t blocks[2] = {(int64_t)((rows + 31) / 32), (int64_t)cblocks};
        int64_t per_row[2] = {(int64_t)rows, (int64_t)cblocks};
        int blocked;
        if (same_shape(s, 2, blocks))
            blocked = 1;
        else if (same_shape(s, 2, per_row))
            blocked = 0;
        else {
            char want_b[64], want_r[64], have[64];
            format_shape(want_b, sizeof want_b, 2, blocks);
            format_shape(want_r, sizeof want_r, 2, per_row);
            format_shape(have, sizeof have, s->ndim, s->shape);
            return fail(err, errlen, BT_ERR_BAD_CHECKPOINT,
                        "%s: scale '%s' of tensor '%s' has shape %s, expected %s (32x32 blocks) "
                        "or %s (per row)",
                        s->file, s->name, t->name, have, want_b, want_r);
        }
        float e4m3[256];
        for (int i = 0; i < 256; i++) e4m3[i] = bt_e4m3_to_f32((uint8_t)i);
        for (size_t r = 0; r < rows; r++) {
            const uint8_t *srow = s->data + (blocked ? r / 32 : r) * cblocks;
            for (size_t c = 0; c < cols; c++)
                out[r * cols + c] = e4m3[p[r * cols + c]] * lut[srow[c / 32]];
        }
        return BT_OK;
    }

    /* I8: packed e2m1 */
    int64_t want[2] = {(int64_t)rows, (int64_t)cblocks};
    if (!same_shape(s, 2, want)) {
        char w[64], have[64];
        format_shape(w, sizeof w, 2, want);
        format_shape(have, sizeof have, s->ndim, s->shape);
        return fail(err, errlen, BT_ERR_BAD_CHECKPOINT,
                    "%s: scale '%s' of packed FP4 tensor '%s' has shape %s, expected %s", s->file,
                    s->name, t->name, have, w);
    }
    size_t half = cols / 2;
    for (size_t r = 0; r < rows; r++) {
        const uint8_t *srow = s->data + r * cblocks;
        for (size_t c = 0; c < cols; c++) {
            uint8_t byte = p[r * half + c / 2];
            uint8_t code = (c & 1) ? (uint8_t)(byte >> 4) : (uint8_t)(byte & 0xf);
            out[r * cols + c] = bt_e2m1_to_f32(code) * lut[srow[c / 32]];
        }
    }
    return BT_OK;
}

/* ---- writer ------------------------------------------------------------------------------ */

typedef struct {
    char *buf;
    size_t len, cap;
} sbuf_t;

static void sb_put(sbuf_t *b, const char *s, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        while (b->len + n + 1 > b->cap) b->cap = b->cap ? 2 * b->cap : 1024;
        b->buf = bt_realloc_or_die(b->buf, b->cap);
    }
    memcpy(b->buf + b->len, s, n);
    b->len += n;
    b->buf[b->len] = '\0';
}

static void sb_printf(sbuf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void sb_printf(sbuf_t *b, const char *fmt, ...)
{
    char tmp[128];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) n = 0;
    if ((size_t)n >= sizeof tmp) n = (int)sizeof tmp - 1; /* only short numbers pass here */
    sb_put(b, tmp, (size_t)n);
}

static void sb_json_string(sbuf_t *b, const char *s)
{
    sb_put(b, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') {
            char esc[2] = {'\\', (char)*p};
            sb_put(b, esc, 2);
        } else if (*p < 0x20) {
            sb_printf(b, "\\u%04x", *p);
        } else {
            sb_put(b, (const char *)p, 1);
        }
    }
    sb_put(b, "\"", 1);
}

static bt_status_t write_all(int fd, const void *data, size_t n, int *errno_p)
{
    const uint8_t *p = data;
    while (n) {
        ssize_t w = write(fd, p, n > (1u << 30) ? (1u << 30) : n);
        if (w < 0) {
            if (errno == EINTR) continue;
            *errno_p = errno;
            return BT_ERR_IO;
        }
        p += w;
        n -= (size_t)w;
    }
    return BT_OK;
}

bt_status_t bt_safetensors_write(const char *path, const bt_tensor_write_t *tensors, size_t n,
                                 char *err, size_t errlen)
{
    if (!path || (n && !tensors))
        return fail(err, errlen, BT_ERR_INVALID_ARG, "safetensors write: bad arguments");

    size_t *sizes = bt_calloc_or_die(n ? n : 1, sizeof *sizes);
    const char **names = bt_calloc_or_die(n ? n : 1, sizeof *names);
    sbuf_t hdr = {0};
    char *tmp = NULL;
    int fd;
    bt_status_t rc = BT_OK;

    for (size_t i = 0; i < n; i++) {
        const bt_tensor_write_t *t = &tensors[i];
        if (!t->name || !*t->name || !strcmp(t->name, "__metadata__")) {
            rc = fail(err, errlen, BT_ERR_INVALID_ARG, "%s: tensor %zu has no usable name", path,
                      i);
            goto out;
        }
        size_t esize = bt_safetensors_dtype_size(t->dtype);
        if (!esize || t->ndim < 0 || t->ndim > BT_SAFETENSORS_MAX_DIMS) {
            rc = fail(err, errlen, BT_ERR_INVALID_ARG, "%s: tensor '%s': bad dtype or ndim", path,
                      t->name);
            goto out;
        }
        size_t count = 1;
        for (int d = 0; d < t->ndim; d++) {
            if (t->shape[d] < 0 || (double)t->shape[d] > JSON_INT_MAX ||
                bt_mul_overflows(count, (size_t)t->shape[d], &count)) {
                rc = fail(err, errlen, BT_ERR_INVALID_ARG, "%s: tensor '%s': bad shape[%d]", path,
                          t->name, d);
                goto out;
            }
        }
        if (bt_mul_overflows(count, esize, &sizes[i]) || (sizes[i] && !t->data)) {
            rc = fail(err, errlen, BT_ERR_INVALID_ARG, "%s: tensor '%s': bad size or no data",
                      path, t->name);
            goto out;
        }
        names[i] = t->name;
    }
    qsort(names, n, sizeof *names, cmp_str);
    for (size_t i = 1; i < n; i++) {
        if (!strcmp(names[i], names[i - 1])) {
            rc = fail(err, errlen, BT_ERR_INVALID_ARG, "%s: tensor '%s' given twice", path,
                      names[i]);
            goto out;
        }
    }

    sb_put(&hdr, "{\"__metadata__\":{\"format\":\"pt\"}", 31);
    size_t offset = 0;
    for (size_t i = 0; i < n; i++) {
        const bt_tensor_write_t *t = &tensors[i];
        sb_put(&hdr, ",", 1);
        sb_json_string(&hdr, t->name);
        sb_printf(&hdr, ":{\"dtype\":\"%s\",\"shape\":[", bt_safetensors_dtype_name(t->dtype));
        for (int d = 0; d < t->ndim; d++) sb_printf(&hdr, "%s%" PRId64, d ? "," : "", t->shape[d]);
        sb_printf(&hdr, "],\"data_offsets\":[%zu,%zu]}", offset, offset + sizes[i]);
        offset += sizes[i];
    }
    sb_put(&hdr, "}", 1);
    while (hdr.len % 8) sb_put(&hdr, " ", 1);

    size_t plen = strlen(path);
    tmp = bt_malloc_or_die(plen + sizeof ".tmp.XXXXXX");
    memcpy(tmp, path, plen);
    memcpy(tmp + plen, ".tmp.XXXXXX", sizeof ".tmp.XXXXXX");
    fd = mkstemp(tmp);
    if (fd < 0) {
        rc = fail(err, errlen, BT_ERR_IO, "%s: cannot create a temp file: %s", path,
                  strerror(errno));
        free(tmp);
        tmp = NULL;
        goto out;
    }
    uint8_t lenbytes[8];
    for (int i = 0; i < 8; i++) lenbytes[i] = (uint8_t)((uint64_t)hdr.len >> (8 * i));
    int e = 0;
    rc = write_all(fd, lenbytes, 8, &e);
    if (rc == BT_OK) rc = write_all(fd, hdr.buf, hdr.len, &e);
    for (size_t i = 0; rc == BT_OK && i < n; i++)
        if (sizes[i]) rc = write_all(fd, tensors[i].data, sizes[i], &e);
    if (rc == BT_OK && (fchmod(fd, 0644) != 0 || fsync(fd) != 0)) {
        e = errno;
        rc = BT_ERR_IO;
    }
    if (close(fd) != 0 && rc == BT_OK) {
        e = errno;
        rc = BT_ERR_IO;
    }
    if (rc == BT_OK && rename(tmp, path) != 0) {
        e = errno;
        rc = BT_ERR_IO;
    }
    if (rc != BT_OK) {
        fail(err, errlen, rc, "%s: write failed: %s", path, strerror(e));
        unlink(tmp);
    }

out:
    free(tmp);
    free(hdr.buf);
    free(names);
    free(sizes);
    return rc;
}
