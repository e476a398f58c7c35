/* safetensors: the strict header parser, the file check and the header writer (see
 * io/safetensors.h). The parser reads exactly the grammar the format uses, from RFC 8259: the
 * header is an object whose values are tensor objects or the metadata object of strings, so no
 * general JSON tree is built. Every read is bounded by the header's end. */
#include "io/safetensors.h"
#include "core/error.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

typedef struct parser {
  const char *p, *end;
  const char *fn, *path;
  const char *start; /* the header's first byte, for the offset of an error */
  int status;        /* LUTRA_OK until the first error */
} parser;

static int fail(parser *ps, const char *what) {
  if (ps->status == LUTRA_OK)
    ps->status = lutra_error(LUTRA_EINVAL, ps->fn,
                             "'%s' has a corrupt safetensors header (at its byte %lld): %s",
                             ps->path, (long long)(ps->p - ps->start), what);
  return ps->status;
}

static void skip_ws(parser *ps) {
  while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r'))
    ps->p++;
}

static bool eat(parser *ps, char c) {
  skip_ws(ps);
  if (ps->p < ps->end && *ps->p == c) {
    ps->p++;
    return true;
  }
  return false;
}

static int expect(parser *ps, char c, const char *what) {
  return eat(ps, c) ? LUTRA_OK : fail(ps, what);
}

static int hex4(parser *ps, unsigned *out) {
  if (ps->end - ps->p < 4) return fail(ps, "a \\u escape is cut short");
  unsigned v = 0;
  for (int i = 0; i < 4; i++) {
    char c = *ps->p++;
    int d = c >= '0' && c <= '9'   ? c - '0'
            : c >= 'a' && c <= 'f' ? c - 'a' + 10
            : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                   : -1;
    if (d < 0) return fail(ps, "a \\u escape has a non-hex digit");
    v = v * 16 + (unsigned)d;
  }
  *out = v;
  return LUTRA_OK;
}

static size_t put_utf8(char *o, unsigned cp) {
  if (cp < 0x80) return o[0] = (char)cp, 1;
  if (cp < 0x800) return o[0] = (char)(0xC0 | cp >> 6), o[1] = (char)(0x80 | (cp & 63)), 2;
  if (cp < 0x10000)
    return o[0] = (char)(0xE0 | cp >> 12), o[1] = (char)(0x80 | (cp >> 6 & 63)),
           o[2] = (char)(0x80 | (cp & 63)), 3;
  o[0] = (char)(0xF0 | cp >> 18), o[1] = (char)(0x80 | (cp >> 12 & 63));
  o[2] = (char)(0x80 | (cp >> 6 & 63)), o[3] = (char)(0x80 | (cp & 63));
  return 4;
}

/* A string into a malloc'ed NUL-terminated buffer (escapes decoded, NUL refused). */
static int string(parser *ps, char **out) {
  *out = NULL;
  if (!eat(ps, '"')) return fail(ps, "a string was expected");
  char buf[ST_MAX_NAME + 4];
  size_t n = 0;
  for (;;) {
    if (ps->p >= ps->end) return fail(ps, "a string is not terminated");
    if (n > ST_MAX_NAME) return fail(ps, "a string is longer than 4096 bytes");
    unsigned char c = (unsigned char)*ps->p++;
    if (c == '"') break;
    if (c < 0x20) return fail(ps, "a string holds a control character");
    if (c != '\\') {
      buf[n++] = (char)c;
      continue;
    }
    if (ps->p >= ps->end) return fail(ps, "a string ends in a backslash");
    char e = *ps->p++;
    const char *simple = strchr("\"\\/bfnrt", e);
    if (e && simple) {
      buf[n++] = "\"\\/\b\f\n\r\t"[simple - "\"\\/bfnrt"];
      continue;
    }
    if (e != 'u') return fail(ps, "a string has an unknown escape");
    unsigned cp, lo;
    TRY(hex4(ps, &cp));
    if (cp >= 0xDC00 && cp < 0xE000) return fail(ps, "a string has a lone low surrogate");
    if (cp >= 0xD800 && cp < 0xDC00) {
      if (ps->end - ps->p < 2 || ps->p[0] != '\\' || ps->p[1] != 'u')
        return fail(ps, "a string has a lone high surrogate");
      ps->p += 2;
      TRY(hex4(ps, &lo));
      if (lo < 0xDC00 || lo >= 0xE000) return fail(ps, "a string has a broken surrogate pair");
      cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
    }
    if (cp == 0) return fail(ps, "a string holds a NUL character");
    n += put_utf8(buf + n, cp);
  }
  *out = malloc(n + 1);
  if (!*out) return ps->status = lutra_error(LUTRA_ENOMEM, ps->fn, "cannot allocate a name");
  memcpy(*out, buf, n);
  (*out)[n] = 0;
  return LUTRA_OK;
}

/* A non-negative integer without sign, fraction, exponent or leading zeros, below 2^63. */
static int integer(parser *ps, uint64_t *out) {
  skip_ws(ps);
  const char *s = ps->p;
  uint64_t v = 0;
  while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9') {
    if (v > (UINT64_C(1) << 62) / 5) return fail(ps, "an integer is too large");
    v = v * 10 + (uint64_t)(*ps->p++ - '0');
  }
  if (ps->p == s) return fail(ps, "a non-negative integer was expected");
  if (*s == '0' && ps->p - s > 1) return fail(ps, "an integer has a leading zero");
  if (v >= (UINT64_C(1) << 63)) return fail(ps, "an integer is too large");
  if (ps->p < ps->end && (*ps->p == '.' || *ps->p == 'e' || *ps->p == 'E'))
    return fail(ps, "an integer was expected, not a fraction");
  *out = v;
  return LUTRA_OK;
}

static int int_array(parser *ps, uint64_t *v, int cap, int *n, const char *what) {
  TRY(expect(ps, '[', what));
  *n = 0;
  if (eat(ps, ']')) return LUTRA_OK;
  do {
    if (*n == cap) return fail(ps, "an array is longer than allowed (shape: 8 dims; offsets: 2)");
    TRY(integer(ps, &v[(*n)++]));
  } while (eat(ps, ','));
  return expect(ps, ']', "an array is not closed");
}

static int tensor_fields(parser *ps, st_tensor *t) {
  bool have_dtype = false, have_shape = false, have_offsets = false;
  TRY(expect(ps, '{', "a tensor entry must be an object"));
  do {
    char *key;
    TRY(string(ps, &key));
    int st = expect(ps, ':', "a ':' was expected after a key");
    if (st == LUTRA_OK && strcmp(key, "dtype") == 0 && !have_dtype) {
      char *d;
      st = string(ps, &d);
      if (st == LUTRA_OK) {
        t->elem_size = strlen(d) < sizeof t->dtype ? st_dtype_size(d) : 0;
        if (!t->elem_size)
          st = fail(ps, "a tensor has an unknown dtype");
        else
          strcpy(t->dtype, d);
        free(d);
      }
      have_dtype = true;
    } else if (st == LUTRA_OK && strcmp(key, "shape") == 0 && !have_shape) {
      uint64_t dims[ST_MAX_DIMS];
      st = int_array(ps, dims, ST_MAX_DIMS, &t->ndim, "shape must be an array");
      for (int i = 0; st == LUTRA_OK && i < t->ndim; i++)
        t->shape[i] = (int64_t)dims[i];
      have_shape = true;
    } else if (st == LUTRA_OK && strcmp(key, "data_offsets") == 0 && !have_offsets) {
      uint64_t off[2];
      int n;
      st = int_array(ps, off, 2, &n, "data_offsets must be an array");
      if (st == LUTRA_OK && n != 2) st = fail(ps, "data_offsets must hold two integers");
      if (st == LUTRA_OK) t->begin = off[0], t->end = off[1];
      have_offsets = true;
    } else if (st == LUTRA_OK) {
      st = fail(ps, "a tensor entry has an unknown or repeated field");
    }
    free(key);
    TRY(st);
  } while (eat(ps, ','));
  TRY(expect(ps, '}', "a tensor entry is not closed"));
  if (!have_dtype || !have_shape || !have_offsets)
    return fail(ps, "a tensor entry lacks dtype, shape or data_offsets");
  return LUTRA_OK;
}

static int metadata(parser *ps, st_file *f) {
  TRY(expect(ps, '{', "__metadata__ must be an object"));
  if (eat(ps, '}')) return LUTRA_OK;
  f->meta_key = calloc(ST_MAX_META, sizeof *f->meta_key);
  f->meta_val = calloc(ST_MAX_META, sizeof *f->meta_val);
  if (!f->meta_key || !f->meta_val)
    return ps->status = lutra_error(LUTRA_ENOMEM, ps->fn, "cannot allocate the metadata");
  do {
    if (f->meta_count == ST_MAX_META) return fail(ps, "__metadata__ has more than 1024 keys");
    int i = f->meta_count++;
    TRY(string(ps, &f->meta_key[i]));
    TRY(expect(ps, ':', "a ':' was expected after a key"));
    TRY(string(ps, &f->meta_val[i]));
    for (int j = 0; j < i; j++)
      if (strcmp(f->meta_key[j], f->meta_key[i]) == 0)
        return fail(ps, "__metadata__ repeats a key");
  } while (eat(ps, ','));
  return expect(ps, '}', "__metadata__ is not closed");
}

static int cmp_name(const void *a, const void *b) {
  return strcmp(((const st_tensor *)a)->name, ((const st_tensor *)b)->name);
}

static int cmp_begin(const void *a, const void *b) {
  const st_tensor *x = *(const st_tensor *const *)a, *y = *(const st_tensor *const *)b;
  return x->begin < y->begin ? -1 : x->begin > y->begin;
}

static int parse(parser *ps, st_file *f) {
  TRY(expect(ps, '{', "the header must be a JSON object"));
  int cap = 0;
  bool have_meta = false;
  if (!eat(ps, '}')) {
    do {
      char *key;
      TRY(string(ps, &key));
      int st = expect(ps, ':', "a ':' was expected after a key");
      if (st == LUTRA_OK && strcmp(key, "__metadata__") == 0) {
        free(key);
        if (have_meta) return fail(ps, "__metadata__ appears twice");
        have_meta = true;
        TRY(metadata(ps, f));
        continue;
      }
      if (st == LUTRA_OK && f->count == cap) {
        int ncap = cap ? cap * 2 : 64;
        st_tensor *nt = realloc(f->t, (size_t)ncap * sizeof *nt);
        if (!nt)
          st = lutra_error(LUTRA_ENOMEM, ps->fn, "cannot allocate the tensor list");
        else
          f->t = nt, cap = ncap;
      }
      if (st != LUTRA_OK) {
        free(key);
        return ps->status = st;
      }
      st_tensor *t = &f->t[f->count++];
      memset(t, 0, sizeof *t);
      t->name = key;
      TRY(tensor_fields(ps, t));
    } while (eat(ps, ','));
    TRY(expect(ps, '}', "the header object is not closed"));
  }
  skip_ws(ps);
  if (ps->p != ps->end) return fail(ps, "bytes follow the header object");
  return LUTRA_OK;
}

/* Every tensor's byte count matches its shape, and the tensors tile the data exactly. */
static int check_layout(st_file *f, uint64_t data_len, const char *path, const char *fn) {
  if (f->count == 0) {
    if (data_len)
      return lutra_error(LUTRA_EINVAL, fn, "'%s': data follows a header of no tensors", path);
    return LUTRA_OK;
  }
  qsort(f->t, (size_t)f->count, sizeof *f->t, cmp_name);
  for (int i = 1; i < f->count; i++)
    if (strcmp(f->t[i - 1].name, f->t[i].name) == 0)
      return lutra_error(LUTRA_EINVAL, fn, "'%s': the header names tensor '%s' twice", path,
                         f->t[i].name);
  const st_tensor **order = malloc((size_t)f->count * sizeof *order);
  if (!order) return lutra_error(LUTRA_ENOMEM, fn, "cannot allocate the tensor list");
  int st = LUTRA_OK;
  for (int i = 0; i < f->count && st == LUTRA_OK; i++) {
    const st_tensor *t = &f->t[i];
    order[i] = t;
    uint64_t n = t->elem_size;
    for (int d = 0; d < t->ndim; d++)
      if (t->shape[d] && n > UINT64_MAX / (uint64_t)t->shape[d])
        n = UINT64_MAX;
      else
        n *= (uint64_t)t->shape[d];
    if (t->end < t->begin || t->end - t->begin != n)
      st = lutra_error(
          LUTRA_EINVAL, fn, "'%s': tensor '%s': data_offsets [%llu, %llu] do not hold its %s shape",
          path, t->name, (unsigned long long)t->begin, (unsigned long long)t->end, t->dtype);
  }
  if (st == LUTRA_OK) qsort(order, (size_t)f->count, sizeof *order, cmp_begin);
  uint64_t at = 0;
  for (int i = 0; i < f->count && st == LUTRA_OK; i++) {
    if (order[i]->begin != at)
      st = lutra_error(LUTRA_EINVAL, fn, "'%s': tensor '%s' %s the data before it", path,
                       order[i]->name, order[i]->begin < at ? "overlaps" : "leaves a hole after");
    at = order[i]->end;
  }
  if (st == LUTRA_OK && at != data_len)
    st = lutra_error(LUTRA_EINVAL, fn,
                     "'%s' is %s: its header describes %llu bytes of data, it holds %llu", path,
                     at > data_len ? "truncated" : "longer than its header says",
                     (unsigned long long)at, (unsigned long long)data_len);
  free(order);
  return st;
}

/* Exactly n bytes at the file's current position. */
static int read_exact(FILE *fp, void *p, size_t n, const char *path, const char *fn) {
  if (fread(p, 1, n, fp) == n) return LUTRA_OK;
  return lutra_error(LUTRA_EINVAL, fn, "cannot read '%s': %s", path,
                     ferror(fp) ? strerror(errno) : "the file shrank while read");
}

/* The file opened and sized: a regular file (a directory or a device has no size to trust). */
static int open_regular(const char *path, FILE **fp, uint64_t *size, const char *fn) {
  *fp = fopen(path, "rb");
  if (!*fp) return lutra_error(LUTRA_EINVAL, fn, "cannot open '%s': %s", path, strerror(errno));
  struct stat sb;
  int st = LUTRA_OK;
  if (fstat(fileno(*fp), &sb) != 0)
    st = lutra_error(LUTRA_EINVAL, fn, "cannot size '%s': %s", path, strerror(errno));
  else if (S_ISDIR(sb.st_mode))
    st = lutra_error(LUTRA_EINVAL, fn, "'%s' is a directory, not a checkpoint file", path);
  else if (!S_ISREG(sb.st_mode))
    st = lutra_error(LUTRA_EINVAL, fn, "'%s' is not a regular file", path);
  if (st != LUTRA_OK) {
    fclose(*fp);
    *fp = NULL;
    return st;
  }
  *size = (uint64_t)sb.st_size;
  return LUTRA_OK;
}

/* The header length, then the header parsed and the layout checked against the file's size,
 * before any data is read: a bogus file is refused after reading at most its header. */
static int read_checked(FILE *fp, uint64_t size, const char *path, st_file *f, const char *fn) {
  unsigned char len8[8];
  if (size < 8)
    return lutra_error(LUTRA_EINVAL, fn, "'%s' is truncated: %llu bytes, not even a header length",
                       path, (unsigned long long)size);
  TRY(read_exact(fp, len8, 8, path, fn));
  uint64_t n = 0;
  for (int i = 7; i >= 0; i--)
    n = n << 8 | len8[i];
  if (n > ST_MAX_HEADER)
    return lutra_error(LUTRA_EINVAL, fn, "'%s': header length %llu exceeds the format's %d", path,
                       (unsigned long long)n, ST_MAX_HEADER);
  if (n > size - 8)
    return lutra_error(LUTRA_EINVAL, fn,
                       "'%s' is truncated: its header needs %llu bytes, %llu follow", path,
                       (unsigned long long)n, (unsigned long long)(size - 8));
  char *header = malloc(n ? n : 1);
  if (!header)
    return lutra_error(LUTRA_ENOMEM, fn, "cannot allocate a header of %llu bytes",
                       (unsigned long long)n);
  int st = read_exact(fp, header, n, path, fn);
  if (st == LUTRA_OK) {
    parser ps = {header, header + n, fn, path, header, LUTRA_OK};
    st = parse(&ps, f);
  }
  free(header);
  uint64_t data_len = size - 8 - n;
  TRY(st);
  TRY(check_layout(f, data_len, path, fn));
  f->size = (size_t)data_len;
  f->bytes = malloc(data_len ? data_len : 1);
  if (!f->bytes)
    return lutra_error(LUTRA_ENOMEM, fn, "cannot allocate %llu bytes of data",
                       (unsigned long long)data_len);
  f->data = f->bytes;
  TRY(read_exact(fp, f->bytes, data_len, path, fn));
  /* a file that grew while read is no longer the one the header describes */
  if (fgetc(fp) != EOF)
    return lutra_error(LUTRA_EINVAL, fn, "cannot read '%s': the file grew while read", path);
  return LUTRA_OK;
}

int st_read(const char *path, st_file *f, const char *fn) {
  memset(f, 0, sizeof *f);
  FILE *fp;
  uint64_t size = 0;
  TRY(open_regular(path, &fp, &size, fn));
  int st = read_checked(fp, size, path, f, fn);
  fclose(fp);
  if (st != LUTRA_OK) st_free(f);
  return st;
}

void st_free(st_file *f) {
  for (int i = 0; i < f->count; i++)
    free(f->t[i].name);
  for (int i = 0; i < f->meta_count; i++) {
    free(f->meta_key[i]);
    free(f->meta_val[i]);
  }
  free(f->t);
  free(f->meta_key);
  free(f->meta_val);
  free(f->bytes);
  memset(f, 0, sizeof *f);
}

const st_tensor *st_find(const st_file *f, const char *name) {
  if (f->count == 0) return NULL;
  st_tensor key = {.name = (char *)name};
  return bsearch(&key, f->t, (size_t)f->count, sizeof *f->t, cmp_name);
}

const char *st_meta(const st_file *f, const char *key) {
  for (int i = 0; i < f->meta_count; i++)
    if (strcmp(f->meta_key[i], key) == 0) return f->meta_val[i];
  return NULL;
}

size_t st_dtype_size(const char *d) {
  static const struct {
    const char *name;
    size_t size;
  } known[] = {{"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E4M3", 1}, {"F8_E5M2", 1}, {"F8_E8M0", 1},
               {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},     {"U32", 4},
               {"F32", 4},  {"I64", 8}, {"U64", 8}, {"F64", 8}};
  for (size_t i = 0; i < sizeof known / sizeof *known; i++)
    if (strcmp(known[i].name, d) == 0) return known[i].size;
  return 0;
}

/* ---- writing ---------------------------------------------------------------------------- */

typedef struct sbuf {
  char *p;
  size_t len, cap;
  bool oom;
} sbuf;

static void put(sbuf *b, const char *s, size_t n) {
  if (b->oom) return;
  if (b->len + n + 1 > b->cap) {
    size_t cap = (b->len + n + 1) * 2;
    char *p = realloc(b->p, cap);
    if (!p) {
      b->oom = true;
      return;
    }
    b->p = p, b->cap = cap;
  }
  memcpy(b->p + b->len, s, n);
  b->len += n;
}

static void put_str(sbuf *b, const char *s) {
  put(b, "\"", 1);
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    char esc[8];
    if (c == '"' || c == '\\') {
      esc[0] = '\\', esc[1] = (char)c;
      put(b, esc, 2);
    } else if (c < 0x20) {
      snprintf(esc, sizeof esc, "\\u%04x", c);
      put(b, esc, 6);
    } else {
      put(b, (const char *)&c, 1);
    }
  }
  put(b, "\"", 1);
}

static void put_u64(sbuf *b, uint64_t v) {
  char num[24];
  int n = snprintf(num, sizeof num, "%llu", (unsigned long long)v);
  put(b, num, (size_t)n);
}

int st_header(const st_out *t, int n, const char *const *meta, int nmeta, char **out, size_t *len,
              const char *fn) {
  sbuf b = {0};
  put(&b, "\0\0\0\0\0\0\0\0{", 9);
  for (int i = 0; i < nmeta; i++) {
    put(&b, i ? "," : "\"__metadata__\":{", i ? 1 : 16);
    put_str(&b, meta[2 * i]);
    put(&b, ":", 1);
    put_str(&b, meta[2 * i + 1]);
  }
  if (nmeta) put(&b, "}", 1);
  uint64_t at = 0;
  for (int i = 0; i < n; i++) {
    if (nmeta || i) put(&b, ",", 1);
    put_str(&b, t[i].name);
    put(&b, ":{\"dtype\":", 10);
    put_str(&b, t[i].dtype);
    put(&b, ",\"shape\":[", 10);
    for (int d = 0; d < t[i].ndim; d++) {
      if (d) put(&b, ",", 1);
      put_u64(&b, (uint64_t)t[i].shape[d]);
    }
    put(&b, "],\"data_offsets\":[", 18);
    put_u64(&b, at);
    put(&b, ",", 1);
    at += t[i].bytes;
    put_u64(&b, at);
    put(&b, "]}", 2);
  }
  put(&b, "}", 1);
  while ((b.len - 8) % 8) /* the data then starts 8-byte aligned, as the format recommends */
    put(&b, " ", 1);
  if (b.oom) {
    free(b.p);
    return lutra_error(LUTRA_ENOMEM, fn, "cannot allocate the header");
  }
  uint64_t h = b.len - 8;
  for (int i = 0; i < 8; i++)
    b.p[i] = (char)(h >> (8 * i) & 0xFF);
  *out = b.p;
  *len = b.len;
  return LUTRA_OK;
}
