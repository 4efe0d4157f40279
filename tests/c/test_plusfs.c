/* C tests of libplusfs against a running cluster: ./test_plusfs CLUSTER_FILE
 * Prints one line per check and ends with "N passed, N failed". */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "plusfs.h"

static int passed, failed;

#define CHECK(cond, ...)                          \
    do {                                          \
        if (cond) {                               \
            passed++;                             \
        } else {                                  \
            failed++;                             \
            printf("FAIL %s:%d: ", __FILE__, __LINE__); \
            printf(__VA_ARGS__);                  \
            printf("\n");                         \
        }                                         \
    } while (0)

static int count_entries(void *arg, const char *name, uint64_t ino, uint8_t kind) {
    (void)name;
    (void)ino;
    (void)kind;
    (*(int *)arg)++;
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s CLUSTER_FILE\n", argv[0]);
        return 2;
    }
    errno = 0;
    CHECK(plusfs_connect("/nonexistent/cluster.toml") == NULL && errno == ENOENT, "connect to a missing map");
    plusfs_t *fs = plusfs_connect(argv[1]);
    CHECK(fs != NULL, "connect: %s", strerror(errno));
    if (!fs) return 1;

    CHECK(plusfs_mkdir(fs, "/ctest", 0755) == 0, "mkdir");
    CHECK(plusfs_mkdir(fs, "/ctest", 0755) == -EEXIST, "mkdir existing gives -EEXIST");
    CHECK(plusfs_mkdir(fs, "/nope/x", 0755) == -ENOENT, "mkdir under a missing parent");

    /* Huge directories: distributed from creation, then entries spread over the servers. */
    CHECK(plusfs_mkdir_hugedir(fs, "/chuge", 0755, 0, 0) == 0, "mkdir of a directory distributed from creation");
    {
        const char *hn[] = {"a", "b", "c", "d", "e", "f", "g", "h"};
        int hr[8];
        CHECK(plusfs_openv(fs, "/chuge", hn, O_CREAT | O_EXCL, 0644, PLUSFS_PERFORM_ALL, hr, 8) == 8,
              "openv into a distributed directory");
        int ok = 1;
        for (int i = 0; i < 8; i++) ok &= hr[i] >= 0;
        CHECK(ok, "every create in the distributed directory succeeded");
        int cr[8];
        CHECK(plusfs_closev(fs, hr, PLUSFS_PERFORM_ALL, cr, 8) == 8, "closev of the distributed directory's files");
        struct stat hst;
        CHECK(plusfs_lstat(fs, "/chuge", &hst) == 0 && hst.st_size == 8, "size of a distributed directory sums its servers");
    }
    CHECK(plusfs_set_hugedir(fs, "/ctest", PLUSFS_HUGEDIR_NEVER, 0) == 0, "set a directory's threshold to never");
    CHECK(plusfs_set_hugedir(fs, "/ctest", -7, 0) == -EINVAL, "a bad threshold is EINVAL");
    CHECK(plusfs_set_hugedir(fs, "/nope", 100, 0) == -ENOENT, "policy of a missing directory is ENOENT");

    enum { N = 2000 };
    static char buf[N][16];
    const char *names[N];
    int rv[N];
    for (int i = 0; i < N; i++) {
        snprintf(buf[i], sizeof buf[i], "f%d", i);
        names[i] = buf[i];
    }
    int done = plusfs_openv(fs, "/ctest", names, O_CREAT | O_EXCL, 0640, PLUSFS_PERFORM_ALL, rv, N);
    CHECK(done == N, "openv performed %d", done);
    int fds_ok = 1;
    for (int i = 0; i < N; i++) fds_ok &= rv[i] >= 0;
    CHECK(fds_ok, "openv gives descriptors");
    int closed[N];
    CHECK(plusfs_closev(fs, rv, PLUSFS_PERFORM_ALL, closed, N) == N, "closev");
    int bad = 12345, badrv = 0;
    plusfs_closev(fs, &bad, PLUSFS_PERFORM_ALL, &badrv, 1);
    CHECK(badrv == -EBADF, "closev of an unknown descriptor gives -EBADF (%d)", badrv);

    static struct stat st[N];
    CHECK(plusfs_statv(fs, "/ctest", names, PLUSFS_PERFORM_ALL, rv, st, N) == N, "statv");
    int stats_ok = 1;
    for (int i = 0; i < N; i++) stats_ok &= rv[i] == 0 && S_ISREG(st[i].st_mode) && (st[i].st_mode & 07777) == 0640;
    CHECK(stats_ok, "statv fills struct stat");

    /* stop-on-failure: the failing entry gets its errno, later ones -ECANCELED */
    const char *mixed[3] = {"new1", "f0", "new2"};
    int mrv[3];
    int performed = plusfs_openv(fs, "/ctest", mixed, O_CREAT | O_EXCL, 0644, PLUSFS_STOP_ON_FAILURE, mrv, 3);
    CHECK(performed == 2 && mrv[0] >= 0 && mrv[1] == -EEXIST && mrv[2] == -ECANCELED,
          "stop-on-failure: %d %d %d %d", performed, mrv[0], mrv[1], mrv[2]);
    plusfs_close(fs, mrv[0]);

    int entries = 0;
    CHECK(plusfs_readdir(fs, "/ctest", count_entries, &entries) == N + 1 && entries == N + 1, "readdir %d", entries);

    struct stat one;
    CHECK(plusfs_stat(fs, "/ctest", &one) == 0 && S_ISDIR(one.st_mode) && one.st_size == N + 1, "stat dir");
    CHECK(plusfs_stat(fs, "/ctest/missing", &one) == -ENOENT, "stat missing");
    int fd = plusfs_open(fs, "/ctest/single", O_CREAT, 0600);
    CHECK(fd >= 0, "open O_CREAT: %d", fd);
    CHECK(plusfs_close(fs, fd) == 0, "close");
    CHECK(plusfs_close(fs, fd) == -EBADF, "double close gives -EBADF");
    CHECK(plusfs_rename(fs, "/ctest/single", "/ctest/renamed") == 0, "rename");
    CHECK(plusfs_link(fs, "/ctest/renamed", "/ctest/linked") == 0, "link");
    CHECK(plusfs_lstat(fs, "/ctest/linked", &one) == 0 && one.st_nlink == 2, "link count after link");
    CHECK(plusfs_link(fs, "/ctest", "/ctest/dirlink") == -EPERM, "link of a directory gives -EPERM");
    CHECK(plusfs_unlink(fs, "/ctest/linked") == 0, "unlink of a link");
    CHECK(plusfs_lstat(fs, "/ctest/renamed", &one) == 0 && one.st_nlink == 1, "link count after unlink");
    CHECK(plusfs_unlink(fs, "/ctest/renamed") == 0, "unlink");
    CHECK(plusfs_rmdir(fs, "/ctest") == -ENOTEMPTY, "rmdir non-empty");

    CHECK(plusfs_unlinkv(fs, "/ctest", names, PLUSFS_PERFORM_ALL, rv, N) == N, "unlinkv");
    CHECK(plusfs_unlinkv(fs, "/ctest", mixed, PLUSFS_PERFORM_ALL, rv, 3) == 3 && rv[0] == 0 && rv[1] == -ENOENT,
          "unlinkv per-entry errors");
    const char *dirs[3] = {"d1", "d2", "bad/name"};
    CHECK(plusfs_mkdirv(fs, "/ctest", dirs, 0755, PLUSFS_PERFORM_ALL, rv, 3) == 3 && rv[0] == 0 && rv[1] == 0 &&
              rv[2] == -EINVAL,
          "mkdirv");
    CHECK(plusfs_rmdir(fs, "/ctest/d1") == 0 && plusfs_rmdir(fs, "/ctest/d2") == 0, "rmdir subdirs");
    CHECK(plusfs_rmdir(fs, "/ctest") == 0, "rmdir");

    /* File contents through descriptors. */
    {
        int fd = plusfs_open(fs, "/cdata", O_CREAT | O_EXCL, 0644);
        CHECK(fd >= 0, "open for writing");
        static char blk[300000];
        for (size_t i = 0; i < sizeof blk; i++) blk[i] = (char)(i * 7);
        CHECK(plusfs_pwrite(fs, fd, blk, sizeof blk, 0) == (ssize_t)sizeof blk, "pwrite 300,000 bytes");
        CHECK(plusfs_pwrite(fs, fd, "end", 3, 1 << 20) == 3, "pwrite past a hole");
        static char back[300000];
        CHECK(plusfs_pread(fs, fd, back, sizeof back, 0) == (ssize_t)sizeof back && memcmp(back, blk, sizeof blk) == 0,
              "pread gives the bytes back");
        char hole[4] = {1, 1, 1, 1};
        CHECK(plusfs_pread(fs, fd, hole, 4, 500000) == 4 && hole[0] == 0 && hole[3] == 0, "a hole reads as zeros");
        CHECK(plusfs_pread(fs, fd, hole, 4, -1) == -EINVAL, "a negative offset is EINVAL");
        CHECK(plusfs_pread(fs, fd, hole, 4, 5 << 20) == 0, "reading past the end gives 0");
        CHECK(plusfs_ftruncate(fs, fd, 10) == 0, "ftruncate");
        struct stat st;
        CHECK(plusfs_lstat(fs, "/cdata", &st) == 0 && st.st_size == 10, "size after ftruncate");
        CHECK(plusfs_fsync(fs, fd) == 0, "fsync");
        CHECK(plusfs_close(fs, fd) == 0, "close");
        int afd = plusfs_open(fs, "/cdata", O_APPEND, 0);
        CHECK(plusfs_pwrite(fs, afd, "xy", 2, 0) == 2, "O_APPEND write");
        CHECK(plusfs_lstat(fs, "/cdata", &st) == 0 && st.st_size == 12, "O_APPEND writes at the end");
        plusfs_close(fs, afd);
        int tfd = plusfs_open(fs, "/cdata", O_TRUNC, 0);
        CHECK(plusfs_lstat(fs, "/cdata", &st) == 0 && st.st_size == 0, "O_TRUNC empties the file");
        CHECK(plusfs_pread(fs, 9999, hole, 4, 0) == -EBADF, "unknown descriptor is EBADF");
        plusfs_close(fs, tfd);
        CHECK(plusfs_unlink(fs, "/cdata") == 0, "unlink the data file");
    }
    {
        const char *hn[] = {"a", "b", "c", "d", "e", "f", "g", "h"};
        int hr[8];
        CHECK(plusfs_rmdir(fs, "/chuge") == -ENOTEMPTY, "rmdir of a non-empty distributed directory");
        CHECK(plusfs_unlinkv(fs, "/chuge", hn, PLUSFS_PERFORM_ALL, hr, 8) == 8, "unlinkv in a distributed directory");
        CHECK(plusfs_rmdir(fs, "/chuge") == 0, "rmdir of an emptied distributed directory");
    }
    CHECK(plusfs_statv(fs, "/ctest", names, PLUSFS_PERFORM_ALL, rv, st, 1) == -ENOENT, "statv of a missing dir");
    CHECK(plusfs_mkdir(NULL, "/x", 0755) == -EFAULT, "NULL handle gives -EFAULT");
    {
        /* Batch-file write and read (BFO). */
        const char *bpaths[3] = {"/cbfo-a", "/cbfo-b", "/"};
        const unsigned char *bdata[3] = {(const unsigned char *)"alpha", (const unsigned char *)"", (const unsigned char *)"x"};
        size_t blens[3] = {5, 0, 1};
        int brv[3];
        CHECK(plusfs_batch_write(fs, bpaths, bdata, blens, 0640, brv, 3) == 2 && brv[0] == 0 && brv[1] == 0 &&
                  brv[2] == -EISDIR,
              "batch_write");
        unsigned char b0[16], b1[16], b2[2];
        unsigned char *bbufs[3] = {b0, b1, b2};
        size_t bcaps[3] = {sizeof b0, sizeof b1, sizeof b2};
        int64_t rsz[3];
        const char *rpaths[3] = {"/cbfo-a", "/cbfo-b", "/cbfo-missing"};
        CHECK(plusfs_batch_read(fs, rpaths, bbufs, bcaps, rsz, 3) == 2 && rsz[0] == 5 && memcmp(b0, "alpha", 5) == 0 &&
                  rsz[1] == 0 && rsz[2] == -ENOENT,
              "batch_read");
        CHECK(plusfs_unlink(fs, "/cbfo-a") == 0 && plusfs_unlink(fs, "/cbfo-b") == 0, "unlink batch files");
    }
    {
        /* A forked child calls through the parent's handle: it gets a fresh runtime and
         * connections there and keeps the descriptors; the parent's handle keeps working. */
        int pfd = plusfs_open(fs, "/cfork", O_CREAT, 0644);
        CHECK(pfd >= 0, "open before fork");
        pid_t pid = fork();
        if (pid == 0) {
            alarm(30); /* a child stuck on the parent's runtime dies instead of hanging */
            int ok = plusfs_mkdir(fs, "/cfork-child", 0755) == 0 && plusfs_pwrite(fs, pfd, "kid", 3, 0) == 3 &&
                     plusfs_close(fs, pfd) == 0 && plusfs_disconnect(fs) == 0;
            _exit(ok ? 0 : 1);
        }
        int status = -1;
        CHECK(pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0,
              "calls in a forked child (status %d)", status);
        struct stat fst;
        CHECK(plusfs_lstat(fs, "/cfork-child", &fst) == 0 && S_ISDIR(fst.st_mode), "the child's mkdir is seen");
        char kid[3];
        CHECK(plusfs_pread(fs, pfd, kid, 3, 0) == 3 && memcmp(kid, "kid", 3) == 0,
              "the parent's descriptor still works and sees the child's write");
        CHECK(plusfs_close(fs, pfd) == 0 && plusfs_unlink(fs, "/cfork") == 0 && plusfs_rmdir(fs, "/cfork-child") == 0,
              "cleanup after fork");
    }
    CHECK(plusfs_disconnect(fs) == 0, "disconnect");

    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
