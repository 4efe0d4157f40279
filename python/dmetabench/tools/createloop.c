/* The create loop of MakeOnedirFiles in C, to measure what Python costs (seed 003
 * §4.2.2): ./createloop DIR COUNT  -> prints files/s. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s DIR COUNT\n", argv[0]);
        return 2;
    }
    if (chdir(argv[1]) != 0) {
        perror(argv[1]);
        return 1;
    }
    long count = atol(argv[2]);
    char name[32];
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (long i = 0; i < count; i++) {
        snprintf(name, sizeof name, "p0.%ld", i);
        int fd = open(name, O_CREAT | O_EXCL | O_WRONLY, 0644);
        if (fd < 0) {
            perror(name);
            return 1;
        }
        close(fd);
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    double s = (b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) / 1e9;
    printf("%.0f\n", count / s);
    for (long i = 0; i < count; i++) {
        snprintf(name, sizeof name, "p0.%ld", i);
        unlink(name);
    }
    return 0;
}
