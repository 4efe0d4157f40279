/*
 * plusfs.h: the C interface of plusfs (libplusfs.so / libplusfs.a).
 * Generated from crates/ffi by cbindgen; do not edit. `make test` checks it is current.
 *
 * Every call returns a value >= 0 on success and a negated errno (-ENOENT, ...) on failure.
 * Batch calls (seed 000 Fig. 5) take a directory and entry names; they return how many
 * entries were performed and fill returnvalues[i] per entry: a file descriptor or 0 on
 * success, a negated errno on failure, -ECANCELED for an entry not performed because an
 * earlier one failed under PLUSFS_STOP_ON_FAILURE.
 */

#ifndef PLUSFS_H
#define PLUSFS_H

#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>

// `plusfs_set_hugedir` threshold: never distribute the directory.
#define PLUSFS_HUGEDIR_NEVER -1

// `plusfs_set_hugedir` threshold: use the cluster's setting.
#define PLUSFS_HUGEDIR_CLUSTER -2

// `plusfs_set_hugedir` threshold: leave the threshold unchanged.
#define PLUSFS_HUGEDIR_KEEP -3

// What a batch does when one of its entries fails (decided by each server on its own).
typedef enum plusfs_semantics_t {
  // Every entry is attempted.
  PLUSFS_PERFORM_ALL = 0,
  // A server stops at its first failed entry.
  PLUSFS_STOP_ON_FAILURE = 1,
} plusfs_semantics_t;

// A connection to one cluster; create with `plusfs_connect`, free with
// `plusfs_disconnect`. A handle may be used from several threads, and in a forked child
// (which gets fresh connections and keeps the descriptors).
typedef struct plusfs_t plusfs_t;

// Called by `plusfs_readdir` once per entry; `kind` is a `DT_*` value. Return non-zero to
// stop the listing.
typedef int (*plusfs_dirent_cb)(void *arg, const char *name, uint64_t ino, uint8_t kind);

#ifdef __cplusplus
extern "C" {
#endif // __cplusplus

// Connects to the cluster described by the cluster map file `cluster_file`. Returns NULL
// and sets `errno` on failure.
//
// # Safety
// `cluster_file` is a valid C string.
struct plusfs_t *plusfs_connect(const char *cluster_file);

// Closes the connections and frees the handle.
//
// # Safety
// `fs` comes from `plusfs_connect` and is not used afterwards.
int plusfs_disconnect(struct plusfs_t *fs);

// Opens files `paths[0..count)` of `dirname` in one batch; `flags` may hold `O_CREAT` and
// `O_EXCL`. `returnvalues[i]` receives a descriptor or a negated errno.
//
// # Safety
// Pointers are valid for `count` elements.
int plusfs_openv(struct plusfs_t *fs,
                 const char *dirname,
                 const char *const *paths,
                 int flags,
                 mode_t mode,
                 enum plusfs_semantics_t semantics,
                 int *returnvalues,
                 int count);

// Closes descriptors in one batch per server; unknown descriptors get -EBADF.
//
// # Safety
// Pointers are valid for `count` elements.
int plusfs_closev(struct plusfs_t *fs,
                  const int *fds,
                  enum plusfs_semantics_t semantics,
                  int *returnvalues,
                  int count);

// `lstat` of `paths[0..count)` of `dirname` in one batch; successful entries fill
// `returnstats[i]`.
//
// # Safety
// Pointers are valid for `count` elements.
int plusfs_statv(struct plusfs_t *fs,
                 const char *dirname,
                 const char *const *paths,
                 enum plusfs_semantics_t semantics,
                 int *returnvalues,
                 struct stat *returnstats,
                 int count);

// Removes `paths[0..count)` of `dirname` in one batch.
//
// # Safety
// Pointers are valid for `count` elements.
int plusfs_unlinkv(struct plusfs_t *fs,
                   const char *dirname,
                   const char *const *paths,
                   enum plusfs_semantics_t semantics,
                   int *returnvalues,
                   int count);

// Creates subdirectories `paths[0..count)` of `dirname` in one batch.
//
// # Safety
// Pointers are valid for `count` elements.
int plusfs_mkdirv(struct plusfs_t *fs,
                  const char *dirname,
                  const char *const *paths,
                  mode_t mode,
                  enum plusfs_semantics_t semantics,
                  int *returnvalues,
                  int count);

// `pread(2)`: reads up to `count` bytes at `offset` of descriptor `fd` into `buf`;
// returns the bytes read (0 at the end of the file) or a negated errno (`-EINVAL` for a
// negative offset).
//
// # Safety
// `fs` is valid; `buf` has room for `count` bytes.
intptr_t plusfs_pread(struct plusfs_t *fs, int fd, void *buf, uintptr_t count, int64_t offset);

// `pwrite(2)`: writes `count` bytes of `buf` at `offset` of descriptor `fd` (at the end
// for `O_APPEND`); returns `count` or a negated errno.
//
// # Safety
// `fs` is valid; `buf` holds `count` bytes.
intptr_t plusfs_pwrite(struct plusfs_t *fs,
                       int fd,
                       const void *buf,
                       uintptr_t count,
                       int64_t offset);

// `ftruncate(2)`.
//
// # Safety
// `fs` is valid.
int plusfs_ftruncate(struct plusfs_t *fs, int fd, int64_t size);

// `fsync(2)`.
//
// # Safety
// `fs` is valid.
int plusfs_fsync(struct plusfs_t *fs, int fd);

// `open(2)`: returns a descriptor (flags: `O_CREAT`, `O_EXCL`, `O_TRUNC`, `O_APPEND`).
//
// # Safety
// `fs` and `path` are valid.
int plusfs_open(struct plusfs_t *fs, const char *path, int flags, mode_t mode);

// `close(2)`.
//
// # Safety
// `fs` is valid.
int plusfs_close(struct plusfs_t *fs, int fd);

// `stat(2)` (follows symbolic links).
//
// # Safety
// `fs`, `path` and `st` are valid.
int plusfs_stat(struct plusfs_t *fs, const char *path, struct stat *st);

// `lstat(2)`.
//
// # Safety
// `fs`, `path` and `st` are valid.
int plusfs_lstat(struct plusfs_t *fs, const char *path, struct stat *st);

// `mkdir(2)`.
//
// # Safety
// `fs` and `path` are valid.
int plusfs_mkdir(struct plusfs_t *fs, const char *path, mode_t mode);

// The ACL of `path` in the short text form (`user::rw-,user:1001:r-x,group::r--,
// mask::r-x,other::---`, numeric ids), written to `buf` (`len` bytes, NUL included):
// the access ACL (its mode bits as an ACL when it has none), or with `default_acl` the
// directory's default ACL (the empty string when it has none). Returns the text's length,
// or a negated errno (`-ERANGE` when `buf` is too small).
//
// # Safety
// `fs` and `path` are valid; `buf` is valid for `len` bytes.
int plusfs_getfacl(struct plusfs_t *fs,
                   const char *path,
                   int default_acl,
                   char *buf,
                   uintptr_t len);

// Sets the access ACL of `path` (or with `default_acl` its default ACL) from `text` in
// the form `plusfs_getfacl` gives; a NULL or empty `text` removes it. Returns 0 or a
// negated errno (`-EINVAL` for a text that is no valid ACL).
//
// # Safety
// `fs` and `path` are valid; `text` is NULL or a valid string.
int plusfs_setfacl(struct plusfs_t *fs, const char *path, int default_acl, const char *text_acl);

// `mkdir(2)` with a huge-directory policy: the directory is spread over `width` servers
// (0: the cluster's setting) once it holds more than `threshold` entries (0: from
// creation; or `PLUSFS_HUGEDIR_NEVER` / `PLUSFS_HUGEDIR_CLUSTER`).
//
// # Safety
// `fs` and `path` are valid.
int plusfs_mkdir_hugedir(struct plusfs_t *fs,
                         const char *path,
                         mode_t mode,
                         int64_t threshold,
                         uint32_t width);

// Changes the huge-directory policy of an existing directory (`PLUSFS_HUGEDIR_KEEP` and
// `width` 0 leave a setting as it is); it is distributed at once if it already holds more
// entries than the new threshold. Returns 0, or a negated errno.
//
// # Safety
// `fs` and `path` are valid.
int plusfs_set_hugedir(struct plusfs_t *fs, const char *path, int64_t threshold, uint32_t width);

// `unlink(2)`.
//
// # Safety
// `fs` and `path` are valid.
int plusfs_unlink(struct plusfs_t *fs, const char *path);

// `rmdir(2)`.
//
// # Safety
// `fs` and `path` are valid.
int plusfs_rmdir(struct plusfs_t *fs, const char *path);

// `rename(2)`.
//
// # Safety
// `fs`, `oldpath` and `newpath` are valid.
int plusfs_rename(struct plusfs_t *fs, const char *oldpath, const char *newpath);

// `link(2)`: a new name `newpath` for the file `oldpath` (not a directory).
//
// # Safety
// `fs`, `oldpath` and `newpath` are valid.
int plusfs_link(struct plusfs_t *fs, const char *oldpath, const char *newpath);

// Lists directory `path` (without `.` and `..`), calling `cb` for each entry in name
// order. Returns the number of entries passed to `cb`.
//
// # Safety
// `fs` and `path` are valid; `cb` is safe to call with `arg`.
int plusfs_readdir(struct plusfs_t *fs, const char *path, plusfs_dirent_cb cb, void *arg);

// BFOw (seed 002 §3.3): creates or replaces the whole files `paths[0..count)` with
// `bufs[i]` (`lens[i]` bytes) and `mode`, many files per request and server. Each
// `returnvalues[i]` is 0 or a negated errno. Returns the number of files written, or a
// negated errno for bad arguments.
//
// # Safety
// `paths`, `bufs`, `lens` and `returnvalues` are valid for `count` elements; each
// `bufs[i]` for `lens[i]` bytes.
int plusfs_batch_write(struct plusfs_t *fs,
                       const char *const *paths,
                       const uint8_t *const *bufs,
                       const uintptr_t *lens,
                       mode_t mode,
                       int *returnvalues,
                       int count);

// BFOr (seed 002 §3.2): reads the whole files `paths[0..count)` into `bufs[i]` (room for
// `caps[i]` bytes), in few large, offset-ordered reads on the servers. `returnvalues[i]`
// is the file's size, or a negated errno (`-ERANGE` when it does not fit). Returns the
// number of files read, or a negated errno for bad arguments.
//
// # Safety
// `paths`, `bufs`, `caps` and `returnvalues` are valid for `count` elements; each
// `bufs[i]` for `caps[i]` bytes.
int plusfs_batch_read(struct plusfs_t *fs,
                      const char *const *paths,
                      uint8_t *const *bufs,
                      const uintptr_t *caps,
                      int64_t *returnvalues,
                      int count);

#ifdef __cplusplus
}  // extern "C"
#endif  // __cplusplus

#endif  /* PLUSFS_H */
