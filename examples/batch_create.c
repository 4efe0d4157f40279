/* Creates, stats and removes COUNT files of a directory with three batch calls.
 *   cc -Iinclude examples/batch_create.c -Lpath/to/lib -lplusfs -o batch_create
 *   ./batch_create cluster.toml /dir 1000 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "plusfs.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s CLUSTER_FILE DIR COUNT\n", argv[0]);
        return 2;
    }
    const char *dir = argv[2];
    int count = atoi(argv[3]);
    if (count <= 0) {
        fprintf(stderr, "COUNT must be positive\n");
        return 2;
    }
    plusfs_t *fs = plusfs_connect(argv[1]);
    if (!fs) {
        fprintf(stderr, "cannot connect: %s\n", strerror(errno));
        return 1;
    }
    int rc = plusfs_mkdir(fs, dir, 0755);
    if (rc < 0 && rc != -EEXIST) {
        fprintf(stderr, "mkdir %s: %s\n", dir, strerror(-rc));
        return 1;
    }
    char **names = calloc(count, sizeof *names);
    int *rv = calloc(count, sizeof *rv);
    struct stat *st = calloc(count, sizeof *st);
    for (int i = 0; i < count; i++) {
        names[i] = malloc(32);
        snprintf(names[i], 32, "file%06d", i);
    }
    double t0 = now();
    int made = plusfs_openv(fs, dir, (const char *const *)names, O_CREAT | O_EXCL, 0644, PLUSFS_PERFORM_ALL, rv, count);
    plusfs_closev(fs, rv, PLUSFS_PERFORM_ALL, rv, made);
    double t1 = now();
    int seen = plusfs_statv(fs, dir, (const char *const *)names, PLUSFS_PERFORM_ALL, rv, st, count);
    double t2 = now();
    int gone = plusfs_unlinkv(fs, dir, (const char *const *)names, PLUSFS_PERFORM_ALL, rv, count);
    double t3 = now();
    printf("openv:   %d files in %.3f s (%.0f/s)\n", made, t1 - t0, made / (t1 - t0));
    printf("statv:   %d files in %.3f s (%.0f/s)\n", seen, t2 - t1, seen / (t2 - t1));
    printf("unlinkv: %d files in %.3f s (%.0f/s)\n", gone, t3 - t2, gone / (t3 - t2));
    for (int i = 0; i < count; i++) free(names[i]);
    free(names);
    free(rv);
    free(st);
    plusfs_rmdir(fs, dir);
    plusfs_disconnect(fs);
    return made == count && seen == count && gone == count ? 0 : 1;
}
