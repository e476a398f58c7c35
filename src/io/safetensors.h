/* The safetensors format (https://github.com/huggingface/safetensors, "Format"): an 8-byte
 * little-endian header length N, N bytes of a UTF-8 JSON object, then the data. The object maps
 * each tensor name to {"dtype", "shape", "data_offsets": [begin, end]} (offsets into the data,
 * which the tensors cover without holes or overlaps) and may hold "__metadata__", an object of
 * strings. Parsing is strict (RFC 8259 JSON; duplicate keys, unknown fields, trailing bytes
 * and offsets that do not tile the data refused) and bounded (limits below). */
#ifndef LUTRA_IO_SAFETENSORS_H
#define LUTRA_IO_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

enum {
  ST_MAX_HEADER = 100000000, /* the reference implementation's limit */
  ST_MAX_NAME = 4096,
  ST_MAX_DIMS = 8,
  ST_MAX_META = 1024
};

typedef struct st_tensor {
  char *name;
  char dtype[12]; /* "F32", "BF16", ... as in the file */
  size_t elem_size;
  int ndim;
  int64_t shape[ST_MAX_DIMS];
  uint64_t begin, end; /* offsets into the data */
} st_tensor;

typedef struct st_file {
  st_tensor *t;
  int count;
  char **meta_key, **meta_val;
  int meta_count;
  unsigned char *bytes;      /* the data section (read once the header was checked) */
  size_t size;               /* its length */
  const unsigned char *data; /* = bytes */
} st_file;

/* Reads and checks path: a regular file; its header length and header first, then its size
 * against the data the header describes, and only then the data. On failure *f is empty and
 * the error names fn and the reason. */
int st_read(const char *path, st_file *f, const char *fn);
void st_free(st_file *f);
const st_tensor *st_find(const st_file *f, const char *name);
const char *st_meta(const st_file *f, const char *key);
/* bytes per element of a safetensors dtype name, 0 if unknown */
size_t st_dtype_size(const char *dtype);

/* What a writer is given: tensors in the order their data is written. */
typedef struct st_out {
  const char *name;
  const char *dtype;
  int ndim;
  const int64_t *shape;
  size_t bytes;
} st_out;
/* The header (length prefix included, padded with spaces to a multiple of 8) for these tensors
 * and metadata pairs; malloc'ed into *out. */
int st_header(const st_out *t, int n, const char *const *meta, int nmeta, char **out, size_t *len,
              const char *fn);

#endif
