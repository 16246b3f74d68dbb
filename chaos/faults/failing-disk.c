/*
 * failing-disk: an LD_PRELOAD shim that makes one data directory's disk "fill up" or its fsync
 * fail, for chaos drill 9 (a coordinator whose disk fills or whose fsync fails must stop serving
 * rather than corrupt). Production code is untouched: the shim sits between the process and libc.
 *
 * Environment (see failing-disk.ts, failingDiskEnv):
 *   FAILING_DISK_DIR      the data directory; only file descriptors whose path (readlink of
 *                         /proc/self/fd/N) is this directory or below it are ever failed, so
 *                         stdout/stderr, sockets and every other file keep working.
 *   FAILING_DISK_TRIGGER  a path; the fault is active exactly while this file exists (one stat()
 *                         per intercepted call under the directory: slow, but this is a drill).
 *   FAILING_DISK_MODE     "enospc":    writes fail with ENOSPC (nothing of the failed call is written);
 *                         "eio-fsync": fsync/fdatasync/sync_file_range fail with EIO (the data may
 *                                      well be in the page cache, but its durability is unknown —
 *                                      exactly the case where a process must not carry on); so
 *                                      does a write on a descriptor opened with O_DSYNC or O_SYNC
 *                                      (the data is written; the sync the flag asks for is what
 *                                      fails): the Raft log's synced appends are such writes.
 *
 * Which calls: LevelDB as bundled by classic-level (deps/leveldb/leveldb-1.20/util/env_posix.cc)
 * writes its WAL, MANIFEST and tables through stdio — fwrite_unlocked() into a FILE buffer,
 * fflush_unlocked() before a sync, fclose() — and syncs with fdatasync() (fsync() for the
 * directory after a new MANIFEST). glibc's stdio reaches the kernel through its own internal
 * write, not through the PLT, so intercepting write() alone would miss every LevelDB write: the
 * stdio entry points are intercepted too. write/pwrite/writev/pwritev are intercepted as well for
 * any other writer (libuv's fs, a newer LevelDB that uses ::write directly).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdio_ext.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

enum mode { MODE_UNSET = 0, MODE_OFF, MODE_ENOSPC, MODE_EIO_FSYNC };

static enum mode g_mode = MODE_UNSET;
static char g_dir[4096];
static size_t g_dir_len;
static char g_trigger[4096];

static void init(void) {
  if (g_mode != MODE_UNSET) return;
  const char *dir = getenv("FAILING_DISK_DIR");
  const char *trig = getenv("FAILING_DISK_TRIGGER");
  const char *mode = getenv("FAILING_DISK_MODE");
  enum mode m = MODE_OFF;
  if (dir != NULL && trig != NULL && mode != NULL && dir[0] == '/' && strlen(dir) < sizeof g_dir && strlen(trig) < sizeof g_trigger) {
    /* Resolve symlinks once (readlink of /proc/self/fd gives the real path). */
    char *real = realpath(dir, NULL);
    const char *use = real != NULL ? real : dir;
    if (strlen(use) < sizeof g_dir) {
      strcpy(g_dir, use);
      g_dir_len = strlen(g_dir);
      while (g_dir_len > 1 && g_dir[g_dir_len - 1] == '/') g_dir[--g_dir_len] = '\0';
      strcpy(g_trigger, trig);
      if (strcmp(mode, "enospc") == 0) m = MODE_ENOSPC;
      else if (strcmp(mode, "eio-fsync") == 0) m = MODE_EIO_FSYNC;
    }
    free(real);
  }
  /* Racing threads compute the same value: a benign race. */
  g_mode = m;
}

/* Whether fd refers to a file at or below the data directory. */
static int under_dir(int fd) {
  if (fd < 0) return 0;
  char link[64];
  char path[4096];
  snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  ssize_t n = readlink(link, path, sizeof path - 1);
  if (n <= 0) return 0;
  path[n] = '\0';
  if ((size_t)n < g_dir_len || strncmp(path, g_dir, g_dir_len) != 0) return 0;
  return path[g_dir_len] == '\0' || path[g_dir_len] == '/';
}

static int triggered(void) {
  struct stat st;
  return stat(g_trigger, &st) == 0;
}

/* Whether a call of this kind on fd must fail now; errno-preserving when it must not. */
static int should_fail(enum mode kind, int fd) {
  init();
  if (g_mode != kind) return 0;
  int saved = errno;
  int fail = under_dir(fd) && triggered();
  errno = saved;
  return fail;
}

/*
 * Mode eio-fsync: a write on an O_DSYNC (or O_SYNC) descriptor syncs before it returns, so it fails
 * as a sync does — after the real write (the bytes reach the page cache), with EIO.
 */
static ssize_t after_write(int fd, ssize_t r) {
  if (r > 0 && should_fail(MODE_EIO_FSYNC, fd)) {
    int fl = fcntl(fd, F_GETFL);
    if (fl != -1 && (fl & O_DSYNC) == O_DSYNC) {
      errno = EIO;
      return -1;
    }
  }
  return r;
}

/* glibc may define some of these as macros when optimising; the shim defines the functions. */
#undef fwrite_unlocked
#undef fflush_unlocked

typedef ssize_t (*write_fn)(int, const void *, size_t);
typedef ssize_t (*pwrite_fn)(int, const void *, size_t, off_t);
typedef ssize_t (*writev_fn)(int, const struct iovec *, int);
typedef ssize_t (*pwritev_fn)(int, const struct iovec *, int, off_t);
typedef size_t (*fwrite_fn)(const void *, size_t, size_t, FILE *);
typedef int (*file_fn)(FILE *);
typedef int (*fd_fn)(int);
typedef int (*sync_range_fn)(int, off64_t, off64_t, unsigned int);

/* The next definition of `name` (libc's), looked up once (a benign race between threads). */
#define REAL(name, type)                \
  static type real_##name = NULL;       \
  if (real_##name == NULL) real_##name = (type)dlsym(RTLD_NEXT, #name)

/* ---- writes (mode enospc) ------------------------------------------------------------------- */

ssize_t write(int fd, const void *buf, size_t count) {
  REAL(write, write_fn);
  if (count > 0 && should_fail(MODE_ENOSPC, fd)) {
    errno = ENOSPC;
    return -1;
  }
  return after_write(fd, real_write(fd, buf, count));
}

ssize_t pwrite(int fd, const void *buf, size_t count, off_t off) {
  REAL(pwrite, pwrite_fn);
  if (count > 0 && should_fail(MODE_ENOSPC, fd)) {
    errno = ENOSPC;
    return -1;
  }
  return after_write(fd, real_pwrite(fd, buf, count, off));
}

ssize_t pwrite64(int fd, const void *buf, size_t count, off_t off) {
  REAL(pwrite64, pwrite_fn);
  if (count > 0 && should_fail(MODE_ENOSPC, fd)) {
    errno = ENOSPC;
    return -1;
  }
  return after_write(fd, real_pwrite64(fd, buf, count, off));
}

ssize_t writev(int fd, const struct iovec *iov, int iovcnt) {
  REAL(writev, writev_fn);
  if (iovcnt > 0 && should_fail(MODE_ENOSPC, fd)) {
    errno = ENOSPC;
    return -1;
  }
  return after_write(fd, real_writev(fd, iov, iovcnt));
}

ssize_t pwritev(int fd, const struct iovec *iov, int iovcnt, off_t off) {
  REAL(pwritev, pwritev_fn);
  if (iovcnt > 0 && should_fail(MODE_ENOSPC, fd)) {
    errno = ENOSPC;
    return -1;
  }
  return after_write(fd, real_pwritev(fd, iov, iovcnt, off));
}

ssize_t pwritev64(int fd, const struct iovec *iov, int iovcnt, off_t off) {
  REAL(pwritev64, pwritev_fn);
  if (iovcnt > 0 && should_fail(MODE_ENOSPC, fd)) {
    errno = ENOSPC;
    return -1;
  }
  return after_write(fd, real_pwritev64(fd, iov, iovcnt, off));
}

/* stdio: a failed fwrite buffers nothing and returns a short count with errno set (what callers check). */
static int stdio_fails(FILE *f) {
  return f != NULL && should_fail(MODE_ENOSPC, fileno(f));
}

size_t fwrite(const void *ptr, size_t size, size_t n, FILE *f) {
  REAL(fwrite, fwrite_fn);
  if (size > 0 && n > 0 && stdio_fails(f)) {
    errno = ENOSPC;
    return 0;
  }
  return real_fwrite(ptr, size, n, f);
}

size_t fwrite_unlocked(const void *ptr, size_t size, size_t n, FILE *f) {
  REAL(fwrite_unlocked, fwrite_fn);
  if (size > 0 && n > 0 && stdio_fails(f)) {
    errno = ENOSPC;
    return 0;
  }
  return real_fwrite_unlocked(ptr, size, n, f);
}

/* A flush with buffered bytes fails (they stay buffered; fclose below drops them). */
int fflush(FILE *f) {
  REAL(fflush, file_fn);
  if (f != NULL && __fpending(f) > 0 && stdio_fails(f)) {
    errno = ENOSPC;
    return EOF;
  }
  return real_fflush(f);
}

int fflush_unlocked(FILE *f) {
  REAL(fflush_unlocked, file_fn);
  if (f != NULL && __fpending(f) > 0 && stdio_fails(f)) {
    errno = ENOSPC;
    return EOF;
  }
  return real_fflush_unlocked(f);
}

/* Closing a stream with unwritten bytes on a full disk: the bytes are lost and fclose reports it. */
int fclose(FILE *f) {
  REAL(fclose, file_fn);
  if (f != NULL && __fpending(f) > 0 && stdio_fails(f)) {
    __fpurge(f);
    real_fclose(f);
    errno = ENOSPC;
    return EOF;
  }
  return real_fclose(f);
}

/* ---- syncs (mode eio-fsync) ------------------------------------------------------------------ */

int fsync(int fd) {
  REAL(fsync, fd_fn);
  if (should_fail(MODE_EIO_FSYNC, fd)) {
    errno = EIO;
    return -1;
  }
  return real_fsync(fd);
}

int fdatasync(int fd) {
  REAL(fdatasync, fd_fn);
  if (should_fail(MODE_EIO_FSYNC, fd)) {
    errno = EIO;
    return -1;
  }
  return real_fdatasync(fd);
}

int sync_file_range(int fd, off64_t off, off64_t nbytes, unsigned int flags) {
  REAL(sync_file_range, sync_range_fn);
  if (should_fail(MODE_EIO_FSYNC, fd)) {
    errno = EIO;
    return -1;
  }
  return real_sync_file_range(fd, off, nbytes, flags);
}
