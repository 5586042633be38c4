/* SPDX-License-Identifier: MIT */
/* replay.c: the main of a fuzz target built without libFuzzer: run it over a corpus, or write the seeds. */

/*
 * Theory of operation: meson test runs each fuzz target built with gcc (or
 * clang without -fsanitize=fuzzer) as "fuzz-TARGET tests/fuzz/corpus/TARGET":
 * every file of the corpus (the seeds and each crash libFuzzer found, kept
 * as a regression input) goes through LLVMFuzzerTestOneInput() once, in
 * name order.  A crash, a sanitizer report or an abort() of the target's
 * own checks fails the test.  "--write-seeds DIR" writes the target's seed
 * inputs (tests/fuzz/make-seeds runs it for every target).
 */

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/fuzz/fuzz.h"

static int run_file(const char *path) {
        uint8_t *buf = NULL;
        size_t size = 0;
        struct stat st;
        FILE *f;

        f = fopen(path, "re");
        if (!f || fstat(fileno(f), &st) < 0) {
                fprintf(stderr, "cannot open %s: %m\n", path);
                if (f)
                        fclose(f);
                return -1;
        }
        size = (size_t) st.st_size;
        buf = malloc(size ? size : 1);          /* exactly the input's size, so ASan sees overreads */
        if (!buf || (size > 0 && fread(buf, size, 1, f) != 1)) {
                fprintf(stderr, "cannot read %s\n", path);
                free(buf);
                fclose(f);
                return -1;
        }
        fclose(f);
        (void) LLVMFuzzerTestOneInput(buf, size);
        free(buf);
        return 0;
}

static int filter(const struct dirent *de) {
        return de->d_name[0] != '.';
}

int main(int argc, char **argv) {
        unsigned n = 0;

        if (argc == 3 && strcmp(argv[1], "--write-seeds") == 0) {
                int r = fuzz_write_seeds(argv[2]);

                if (r < 0) {
                        fprintf(stderr, "cannot write the seeds into %s: %s\n", argv[2], strerror(-r));
                        return 1;
                }
                return 0;
        }
        if (argc < 2) {
                fprintf(stderr, "usage: %s CORPUS-DIR|FILE...  or  %s --write-seeds DIR\n", argv[0], argv[0]);
                return 2;
        }
        (void) LLVMFuzzerInitialize(&argc, &argv);
        for (int i = 1; i < argc; i++) {
                struct dirent **list = NULL;
                struct stat st;
                int m;

                if (stat(argv[i], &st) < 0) {
                        fprintf(stderr, "%s: %m\n", argv[i]);
                        return 1;
                }
                if (!S_ISDIR(st.st_mode)) {
                        if (run_file(argv[i]) < 0)
                                return 1;
                        n++;
                        continue;
                }
                m = scandir(argv[i], &list, filter, alphasort);
                if (m < 0) {
                        fprintf(stderr, "%s: %m\n", argv[i]);
                        return 1;
                }
                for (int k = 0; k < m; k++) {
                        char path[4096];
                        int r;

                        snprintf(path, sizeof(path), "%s/%s", argv[i], list[k]->d_name);
                        fprintf(stderr, "replay %s\n", path);
                        r = run_file(path);
                        free(list[k]);
                        if (r < 0)
                                return 1;
                        n++;
                }
                free(list);
        }
        if (n == 0) {
                fprintf(stderr, "no inputs: the corpus is empty\n");
                return 1;
        }
        printf("%u inputs replayed\n", n);
        return 0;
}
