/* SPDX-License-Identifier: MIT */
/* test-wear.c: the drive wear book's file, atomic state files, and the metrics text. */

/*
 * wear: the file round-trips (names with blanks, newlines, '%' and non-ASCII
 * bytes too), a corrupt file is refused with the line and the reason, set
 * aside as wear.corrupt and the book starts empty; jobs that end add to
 * their name's entry; the book is bounded.  statefile: the file is replaced
 * whole and no temporary is left; a state directory others can write
 * is not trusted.  metrics: the text of a hand-made status
 * has HELP and TYPE lines before its samples and escapes label values.
 */

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <grp.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>
#include <cmocka.h>

#include "daemon/base/statefile.h"
#include "daemon/ipc/metrics.h"
#include "daemon/state/registry.h"
#include "daemon/state/wear.h"
#include "daemon/tiers/tier-nvme.h"
#include "tier.pb-c.h"

static char dir[PATH_MAX];

static int setup(void **state) {
        (void) snprintf(dir, sizeof(dir), "/tmp/test-wear-XXXXXX");
        return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state) {
        char cmd[PATH_MAX + 16];

        (void) snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
        return system(cmd) == 0 ? 0 : -1;
}

static void write_file(const char *name, const char *text) {
        char path[PATH_MAX + 64];

        (void) snprintf(path, sizeof(path), "%s/%s", dir, name);
        assert_int_equal(statefile_write(path, text, strlen(text), 0644), 0);
}

static bool exists(const char *name) {
        char path[PATH_MAX + 64];

        (void) snprintf(path, sizeof(path), "%s/%s", dir, name);
        return access(path, F_OK) == 0;
}

/* Files in dir (temporaries left behind would show). */
static unsigned n_files(void) {
        DIR *d = opendir(dir);
        struct dirent *de;
        unsigned n = 0;

        assert_non_null(d);
        while ((de = readdir(d)))
                if (de->d_name[0] != '.')
                        n++;
        closedir(d);
        return n;
}

/* Set-aside copies of the book in dir ("wear.corrupt.*"). */
static unsigned n_aside(void) {
        DIR *d = opendir(dir);
        struct dirent *de;
        unsigned n = 0;

        assert_non_null(d);
        while ((de = readdir(d)))
                if (strncmp(de->d_name, "wear.corrupt.", 13) == 0)
                        n++;
        closedir(d);
        return n;
}

static void test_roundtrip(void **state) {
        Wear *w = NULL, *back = NULL;
        NvmeTarget targets[2] = { { .path = (char *) "/srv/a b.img", .wear_base = 100, .bytes_written = 23 },
                                  { .path = (char *) "/dev/nvme0n1", .bytes_written = 7 } };
        NvmeTier nvme = { .targets = targets, .n_targets = 2 };
        char *text = NULL, why[256] = "";
        Job j = { .name = (char *) "job\n%x \xc3\xa9", .nvme_written = 4096 };

        assert_int_equal(wear_new(dir, &w), 0);
        wear_job_end(w, &j);
        wear_job_end(w, &j);
        assert_int_equal(wear_job_base(w, "job\n%x \xc3\xa9"), 8192);
        assert_int_equal(wear_job_base(w, "other"), 0);
        assert_int_equal(wear_format(w, &nvme, NULL, &text), 0);
        assert_string_equal(text, "tierd-wear 1\n"
                            "target /srv/a%20b.img 123\n"
                            "target /dev/nvme0n1 7\n"
                            "job job%0A%25x%20%C3%A9 8192\n");
        assert_int_equal(wear_new(dir, &back), 0);
        assert_int_equal(wear_parse(back, text, why, sizeof(why)), 0);
        assert_int_equal(back->n_targets, 2);
        assert_string_equal(back->targets[0].name, "/srv/a b.img");
        assert_int_equal(back->targets[0].bytes, 123);
        assert_int_equal(wear_job_base(back, "job\n%x \xc3\xa9"), 8192);
        free(text);
        wear_free(back);
        wear_free(w);
}

/* wear_save() then wear_load(): the targets' bases are set, the file is replaced whole. */
static void test_save_load(void **state) {
        NvmeTarget t = { .path = (char *) "/srv/t0.img", .bytes_written = 5 << 20 };
        NvmeTier nvme = { .targets = &t, .n_targets = 1 };
        Wear *w = NULL;
        char why[512] = "";

        assert_int_equal(wear_new(dir, &w), 0);
        assert_int_equal(wear_load(w, &nvme, why, sizeof(why)), 1);    /* no file yet */
        assert_int_equal(wear_save(w, &nvme, NULL), 0);
        assert_int_equal(wear_save(w, &nvme, NULL), 0);
        assert_true(exists("wear"));
        assert_int_equal(n_files(), 1);         /* no temporary left */
        wear_free(w);

        t.bytes_written = 0;
        assert_int_equal(wear_new(dir, &w), 0);
        assert_int_equal(wear_load(w, &nvme, why, sizeof(why)), 0);
        assert_int_equal(t.wear_base, 5 << 20);
        wear_free(w);
}

static void expect_corrupt(const char *text, const char *reason) {
        NvmeTarget t = { .path = (char *) "/srv/t0.img", .wear_base = 99 };
        NvmeTier nvme = { .targets = &t, .n_targets = 1 };
        Wear *w = NULL;
        char why[512] = "";
        unsigned before = n_aside();

        if (text)
                write_file("wear", text);
        else {          /* a FIFO: opening it must not block */
                char path[PATH_MAX + 64];

                (void) snprintf(path, sizeof(path), "%s/wear", dir);
                assert_int_equal(mkfifo(path, 0600), 0);
        }
        assert_int_equal(wear_new(dir, &w), 0);
        assert_int_equal(wear_load(w, &nvme, why, sizeof(why)), 2);
        if (!strstr(why, reason) || !strstr(why, "it was kept as"))
                fail_msg("reason '%s' lacks '%s'", why, reason);
        assert_int_equal(w->n_targets, 0);
        assert_int_equal(w->n_jobs, 0);
        assert_false(exists("wear"));
        /* a new copy beside the older ones (never over one), at most STATEFILE_ASIDE_MAX of them */
        assert_int_equal(n_aside(), before < STATEFILE_ASIDE_MAX ? before + 1 : STATEFILE_ASIDE_MAX);
        wear_free(w);
}

static void test_corrupt(void **state) {
        expect_corrupt("", "it does not end with a newline");
        expect_corrupt("tierd-wear 1\ntarget /a 12", "does not end with a newline");
        expect_corrupt("tierd-wear 2\n", "line 1 is not \"tierd-wear 1\"");
        expect_corrupt("tierd-wear 1\ntarget /a\n", "line 2 is not \"target|job NAME BYTES\"");
        expect_corrupt("tierd-wear 1\ntarget /a 1 2\n", "line 2 is not");
        expect_corrupt("tierd-wear 1\njob a -1\n", "line 2: '-1' is not a byte count");
        expect_corrupt("tierd-wear 1\njob a 99999999999999999999\n", "is not a byte count");
        expect_corrupt("tierd-wear 1\njob a%0 1\n", "line 2 has a bad name");
        expect_corrupt("tierd-wear 1\njob a%00b 1\n", "line 2 has a bad name");
        expect_corrupt("tierd-wear 1\ndisk /a 1\n", "line 2: unknown kind 'disk'");
        expect_corrupt("\x01\x02garbage\n", "line 1 is not");
        expect_corrupt(NULL, "it is not a regular file");
        assert_int_equal(n_aside(), STATEFILE_ASIDE_MAX);      /* 12 set aside, the oldest 4 removed */

        /* a NUL byte (a block zeroed by damage): not the book cut at the NUL, with the entries after it lost */
        {
                static const char nul[] = "tierd-wear 1\ntarget /a 1\n\0job b 7\n";
                NvmeTier nvme = {};
                char path[PATH_MAX + 64], why[512] = "";
                Wear *w = NULL;

                (void) snprintf(path, sizeof(path), "%s/wear", dir);
                assert_int_equal(statefile_write(path, nul, sizeof(nul) - 1, 0644), 0);
                assert_int_equal(wear_new(dir, &w), 0);
                assert_int_equal(wear_load(w, &nvme, why, sizeof(why)), 2);
                if (!strstr(why, "NUL byte") || !strstr(why, "it was kept as"))
                        fail_msg("reason '%s'", why);
                assert_false(exists("wear"));
                wear_free(w);
        }
}

/*
 * The copies pruned are the oldest: within one second ".10" and ".11" came after ".2".
 * They were sorted by strcmp(), which put "STAMP.10" before "STAMP.2" and removed
 * the newer ones.
 */
static void test_aside_prune_oldest(void **state) {
        static const char stamp[] = "wear.corrupt.20200101T000000Z";
        char name[64], aside[PATH_MAX + 64], path[PATH_MAX + 64];

        write_file(stamp, "x\n");
        for (unsigned k = 1; k <= 11; k++) {
                (void) snprintf(name, sizeof(name), "%s.%u", stamp, k);
                write_file(name, "x\n");
        }
        write_file("wear", "x\n");
        (void) snprintf(path, sizeof(path), "%s/wear", dir);
        assert_int_equal(statefile_set_aside(path, aside, sizeof(aside)), 0);

        /* 13 copies: the new one and .5 to .11 stay; the stamp alone and .1 to .4 go */
        assert_int_equal(n_aside(), STATEFILE_ASIDE_MAX);
        assert_true(exists(strrchr(aside, '/') + 1));
        assert_false(exists(stamp));
        for (unsigned k = 1; k <= 11; k++) {
                (void) snprintf(name, sizeof(name), "%s.%u", stamp, k);
                if (exists(name) != (k >= 5))
                        fail_msg("%s %s", name, k >= 5 ? "was removed (newer than .4)" : "was kept (older than .5)");
        }
}

/* Past WEAR_JOBS_MAX names, the one with the fewest bytes goes. */
static void test_bounded(void **state) {
        Wear *w = NULL;
        char name[32];

        assert_int_equal(wear_new(dir, &w), 0);
        for (unsigned i = 0; i < WEAR_JOBS_MAX; i++) {
                Job j = { .name = name, .nvme_written = 1000 + i };

                (void) snprintf(name, sizeof(name), "job%u", i);
                wear_job_end(w, &j);
        }
        assert_false(w->forgot);
        {
                Job j = { .name = (char *) "big", .nvme_written = 1 << 30 };
                Job small = { .name = (char *) "tiny", .nvme_written = 1 };

                wear_job_end(w, &j);
                assert_true(w->forgot);
                assert_int_equal(w->n_jobs, WEAR_JOBS_MAX);
                assert_int_equal(wear_job_base(w, "big"), 1 << 30);
                assert_int_equal(wear_job_base(w, "job0"), 0);          /* the fewest bytes: gone */
                wear_job_end(w, &small);                                /* fewer than any: not kept */
                assert_int_equal(wear_job_base(w, "tiny"), 0);
                assert_int_equal(wear_job_base(w, "job1"), 1001);
        }
        wear_free(w);
}

/* fsync() of a directory fails while this is set (statefile_write()'s last step), for test_statefile_dir_sync_fails. */
static bool fail_dir_fsync;

int fsync(int fd) {
        static int (*real)(int);
        struct stat st;

        if (!real)
                *(void **) &real = dlsym(RTLD_NEXT, "fsync");
        if (fail_dir_fsync && fstat(fd, &st) == 0 && S_ISDIR(st.st_mode)) {
                errno = EIO;
                return -1;
        }
        return real(fd);
}

/* The file is replaced but its directory's fsync() fails: not an error (the caller would keep the old state while
 * the file holds the new), 1. */
static void test_statefile_dir_sync_fails(void **state) {
        char path[PATH_MAX + 64], *text = NULL;
        size_t len = 0;

        (void) snprintf(path, sizeof(path), "%s/g", dir);
        assert_int_equal(statefile_write(path, "old\n", 4, 0600), 0);
        fail_dir_fsync = true;
        assert_int_equal(statefile_write(path, "new\n", 4, 0600), 1);
        fail_dir_fsync = false;
        assert_int_equal(statefile_read(path, 100, &text, &len), 0);
        assert_string_equal(text, "new\n");
        free(text);
}

static void test_statefile(void **state) {
        char path[PATH_MAX + 64], *text = NULL, aside[PATH_MAX + 64];
        struct stat a, b;
        size_t len = 0;

        (void) snprintf(path, sizeof(path), "%s/f", dir);
        assert_int_equal(statefile_write(path, "one\n", 4, 0600), 0);
        assert_int_equal(stat(path, &a), 0);
        assert_int_equal(a.st_mode & 0777, 0600);
        assert_int_equal(statefile_write(path, "two!\n", 5, 0644), 0);
        assert_int_equal(stat(path, &b), 0);
        assert_int_equal(b.st_mode & 0777, 0644);
        assert_true(a.st_ino != b.st_ino);      /* replaced, not rewritten in place */
        assert_int_equal(statefile_read(path, 100, &text, &len), 0);
        assert_string_equal(text, "two!\n");
        assert_int_equal(len, 5);
        free(text);
        assert_int_equal(statefile_read(path, 4, &text, &len), -EFBIG);
        assert_int_equal(statefile_set_aside(path, aside, sizeof(aside)), 0);
        assert_non_null(strstr(aside, "/f.corrupt"));
        assert_int_equal(statefile_read(path, 100, &text, &len), -ENOENT);
        /* a directory that is not there: an error, nothing left behind */
        (void) snprintf(path, sizeof(path), "%s/nodir/f", dir);
        assert_int_equal(statefile_write(path, "x", 1, 0644), -ENOENT);
}

/* Who may put names in the state directory: tierd's user (or root), its group, nobody else. */
static void test_statefile_dir_trusted(void **state) {
        struct stat st = { .st_mode = S_IFDIR | 0750, .st_uid = 1000, .st_gid = 1000 };
        char why[256];

        assert_int_equal(statefile_dir_trusted(&st, 1000, 1000, why, sizeof(why)), 0);
        st.st_uid = 0;                          /* root's, read by a tierd of another user */
        assert_int_equal(statefile_dir_trusted(&st, 1000, 1000, why, sizeof(why)), 0);
        st.st_uid = 1001;                       /* another user's */
        assert_int_equal(statefile_dir_trusted(&st, 0, 0, why, sizeof(why)), -EPERM);
        assert_non_null(strstr(why, "uid 1001"));
        st.st_uid = 0;
        st.st_mode = S_IFDIR | 0770;            /* its group may write: tierd's own group only */
        st.st_gid = 0;
        assert_int_equal(statefile_dir_trusted(&st, 0, 0, why, sizeof(why)), 0);
        st.st_gid = 1000;
        assert_int_equal(statefile_dir_trusted(&st, 0, 0, why, sizeof(why)), -EPERM);
        assert_non_null(strstr(why, "group 1000"));
        st.st_mode = S_IFDIR | 01777;           /* sticky keeps nobody from making a name */
        st.st_gid = 0;
        assert_int_equal(statefile_dir_trusted(&st, 0, 0, why, sizeof(why)), -EPERM);
        assert_non_null(strstr(why, "every user"));
        assert_non_null(strstr(why, "as /tmp is: make one of tierd's own in it"));     /* not "chmod o-w /tmp" */
        st.st_mode = S_IFDIR | 0777;            /* not sticky: one to mend */
        assert_int_equal(statefile_dir_trusted(&st, 0, 0, why, sizeof(why)), -EPERM);
        assert_non_null(strstr(why, "chmod o-w it"));
        st.st_mode = S_IFREG | 0600;
        assert_int_equal(statefile_dir_trusted(&st, 0, 0, why, sizeof(why)), -ENOTDIR);
}

/*
 * An NVMe target's directory is judged as the state directory is (statefile_resolve_trusted()): a name in
 * one others can write is refused, a link is followed only from a trusted directory and where it leads is
 * judged the same, and what comes back is a directory fd and a name that is no link.  A device node
 * straight in /dev (root's, 0755), as /dev/nvme0n1 is, passes.
 */
static void test_statefile_resolve_trusted(void **state) {
        char path[PATH_MAX + 32], open_dir[PATH_MAX + 8], base[NAME_MAX + 1], why[768];
        int fd = -1;

        (void) snprintf(open_dir, sizeof(open_dir), "%s/open", dir);
        assert_int_equal(mkdir(open_dir, 0755), 0);
        assert_int_equal(chmod(open_dir, 0777), 0);
        (void) snprintf(path, sizeof(path), "%s/t.img", open_dir);
        assert_int_equal(statefile_resolve_trusted(path, geteuid(), getegid(), &fd, base, sizeof(base), why,
                                                   sizeof(why)), -EPERM);
        assert_non_null(strstr(why, "open\" holding \"t.img\" is not trusted: it is writable by every user"));
        assert_int_equal(fd, -1);

        (void) snprintf(path, sizeof(path), "%s/t.img", dir);          /* trusted, not there yet */
        assert_int_equal(statefile_resolve_trusted(path, geteuid(), getegid(), &fd, base, sizeof(base), why,
                                                   sizeof(why)), 0);
        assert_string_equal(base, "t.img");
        assert_true(fd >= 0);
        assert_int_equal(close(fd), 0);

        assert_int_equal(symlink("open/t.img", path), 0);              /* a link into the open one */
        assert_int_equal(statefile_resolve_trusted(path, geteuid(), getegid(), &fd, base, sizeof(base), why,
                                                   sizeof(why)), -EPERM);
        assert_non_null(strstr(why, "(where a link leads) is not trusted"));
        assert_int_equal(unlink(path), 0);
        assert_int_equal(chmod(open_dir, 0755), 0);                    /* now it is not open: followed */
        assert_int_equal(symlink("open/t.img", path), 0);
        fd = -1;
        assert_int_equal(statefile_resolve_trusted(path, geteuid(), getegid(), &fd, base, sizeof(base), why,
                                                   sizeof(why)), 0);
        assert_string_equal(base, "t.img");
        {
                struct stat a, b;

                assert_int_equal(fstat(fd, &a), 0);
                assert_int_equal(stat(open_dir, &b), 0);
                assert_true(a.st_ino == b.st_ino && a.st_dev == b.st_dev);
        }
        assert_int_equal(close(fd), 0);
        assert_int_equal(unlink(path), 0);
        assert_int_equal(symlink("t.img", path), 0);                   /* a link to itself: bounded */
        assert_int_equal(statefile_resolve_trusted(path, geteuid(), getegid(), &fd, base, sizeof(base), why,
                                                   sizeof(why)), -ELOOP);
        assert_int_equal(unlink(path), 0);
        assert_int_equal(rmdir(open_dir), 0);

        fd = -1;
        assert_int_equal(statefile_resolve_trusted("/dev/null", geteuid(), getegid(), &fd, base, sizeof(base),
                                                   why, sizeof(why)), 0);
        assert_string_equal(base, "null");
        assert_int_equal(close(fd), 0);
}

/*
 * A link in a directory above the last one was followed by open() unjudged: "D/open/l/t.img", l a link
 * planted in the 0777 "open" and leading to the trusted "closed", was taken as "closed/t.img" (a link
 * another user made aimed root's tierd at a file of that name in any trusted directory).  A link there is
 * followed only when its own directory passes, as one in the last directory is; a link loop there is
 * -ELOOP with @why set (it was left unwritten, and the refusal logged whatever the buffer held).
 */
static void test_statefile_resolve_trusted_components(void **state) {
        char path[PATH_MAX + 32], sub[PATH_MAX + 16], base[NAME_MAX + 1], why[768];
        struct stat a, b;
        int fd = -1;

        (void) snprintf(sub, sizeof(sub), "%s/open", dir);
        assert_int_equal(mkdir(sub, 0755), 0);
        assert_int_equal(chmod(sub, 0777), 0);
        (void) snprintf(sub, sizeof(sub), "%s/closed", dir);
        assert_int_equal(mkdir(sub, 0700), 0);
        (void) snprintf(path, sizeof(path), "%s/open/l", dir);
        assert_int_equal(symlink("../closed", path), 0);
        (void) snprintf(path, sizeof(path), "%s/open/l/t.img", dir);
        assert_int_equal(statefile_resolve_trusted(path, geteuid(), getegid(), &fd, base, sizeof(base), why,
                                                   sizeof(why)), -EPERM);
        assert_non_null(strstr(why, "open\" holding \"l\" is not trusted: it is writable by every user"));
        assert_int_equal(fd, -1);

        (void) snprintf(path, sizeof(path), "%s/l", dir);              /* a link in a trusted one: followed */
        assert_int_equal(symlink("closed", path), 0);
        (void) snprintf(path, sizeof(path), "%s/l/../closed/t.img", dir);
        assert_int_equal(statefile_resolve_trusted(path, geteuid(), getegid(), &fd, base, sizeof(base), why,
                                                   sizeof(why)), 0);
        assert_string_equal(base, "t.img");
        assert_int_equal(fstat(fd, &a), 0);
        assert_int_equal(stat(sub, &b), 0);
        assert_true(a.st_ino == b.st_ino && a.st_dev == b.st_dev);
        assert_int_equal(close(fd), 0);

        (void) snprintf(path, sizeof(path), "%s/loop", dir);           /* a loop above the last directory */
        assert_int_equal(symlink("loop", path), 0);
        (void) snprintf(path, sizeof(path), "%s/loop/t.img", dir);
        memset(why, 'X', sizeof(why));
        why[sizeof(why) - 1] = '\0';
        fd = -1;
        assert_int_equal(statefile_resolve_trusted(path, geteuid(), getegid(), &fd, base, sizeof(base), why,
                                                   sizeof(why)), -ELOOP);
        assert_non_null(strstr(why, "symbolic links"));
        assert_int_equal(fd, -1);
}

/* statefile_resolve_trusted(@path) for uid and gid 65534, in a child that becomes them: what it gave. */
typedef struct {
        int r;
        dev_t dev;
        ino_t ino;
        char base[NAME_MAX + 1];
        char why[768];
} NobodyResolved;

static void resolve_as_nobody(const char *path, NobodyResolved *ret) {
        int p[2], status = 0;
        pid_t pid;

        assert_int_equal(pipe2(p, O_CLOEXEC), 0);
        pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
                NobodyResolved res = { .r = -EBADE };
                struct stat st;
                int fd = -1;

                if (setgroups(0, NULL) == 0 && setresgid(65534, 65534, 65534) == 0 &&
                    setresuid(65534, 65534, 65534) == 0)
                        res.r = statefile_resolve_trusted(path, geteuid(), getegid(), &fd, res.base,
                                                          sizeof(res.base), res.why, sizeof(res.why));
                if (res.r == 0 && fstat(fd, &st) == 0) {
                        res.dev = st.st_dev;
                        res.ino = st.st_ino;
                }
                _exit(write(p[1], &res, sizeof(res)) == (ssize_t) sizeof(res) ? 0 : 1);
        }
        assert_int_equal(close(p[1]), 0);
        assert_int_equal(read(p[0], ret, sizeof(*ret)), (ssize_t) sizeof(*ret));
        assert_int_equal(close(p[0]), 0);
        assert_int_equal(waitpid(pid, &status, 0), pid);
        assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
        assert_int_not_equal(ret->r, -EBADE);   /* it became uid 65534 */
}

/*
 * A tierd not run as root needs only search permission on a directory of a target's path, as the open
 * itself does: a link in a 0711 directory of root's ("x/l" -> ../closed), or the target's name there,
 * was -EACCES, the directory holding it being opened O_RDONLY (read permission) to be judged.  It is
 * judged as strictly: group-writable (0731, root's group) is refused, and so is a POSIX ACL letting
 * user 1234 write where the link leads (read through /proc/self/fd: the directory fd is O_PATH).
 */
static void test_statefile_resolve_trusted_search_only(void **state) {
        /* user::rwx user:1234:rwx group::r-x mask::rwx other::r-x (little-endian, version 2) */
        const unsigned char acl[] = { 2, 0, 0, 0,
                                      0x01, 0, 7, 0, 0xff, 0xff, 0xff, 0xff,
                                      0x02, 0, 7, 0, 0xd2, 0x04, 0, 0,
                                      0x04, 0, 5, 0, 0xff, 0xff, 0xff, 0xff,
                                      0x10, 0, 7, 0, 0xff, 0xff, 0xff, 0xff,
                                      0x20, 0, 5, 0, 0xff, 0xff, 0xff, 0xff };
        char x[PATH_MAX + 8], closed[PATH_MAX + 8], path[PATH_MAX + 32];
        NobodyResolved res;
        struct stat st;

        if (geteuid() != 0)
                skip();         /* becoming uid 65534 needs root */
        (void) snprintf(x, sizeof(x), "%s/x", dir);
        (void) snprintf(closed, sizeof(closed), "%s/closed", dir);
        assert_int_equal(chmod(dir, 0711), 0);
        assert_int_equal(mkdir(x, 0700), 0);
        assert_int_equal(chmod(x, 0711), 0);
        assert_int_equal(mkdir(closed, 0755), 0);
        assert_int_equal(stat(closed, &st), 0);
        (void) snprintf(path, sizeof(path), "%s/l", x);
        assert_int_equal(symlink("../closed", path), 0);

        (void) snprintf(path, sizeof(path), "%s/l/t.img", x);          /* a link in the 0711 one */
        resolve_as_nobody(path, &res);
        assert_int_equal(res.r, 0);
        assert_string_equal(res.base, "t.img");
        assert_true(res.dev == st.st_dev && res.ino == st.st_ino);
        (void) snprintf(path, sizeof(path), "%s/t.img", x);            /* the name in the 0711 one */
        resolve_as_nobody(path, &res);
        assert_int_equal(res.r, 0);
        assert_string_equal(res.base, "t.img");

        assert_int_equal(chmod(x, 0731), 0);                           /* root's group may write it */
        (void) snprintf(path, sizeof(path), "%s/l/t.img", x);
        resolve_as_nobody(path, &res);
        assert_int_equal(res.r, -EPERM);
        assert_non_null(strstr(res.why, "x\" holding \"l\" is not trusted: it is writable by group 0"));
        assert_int_equal(chmod(x, 0711), 0);

        if (setxattr(closed, "system.posix_acl_access", acl, sizeof(acl), 0) < 0) {
                assert_true(errno == EOPNOTSUPP);
                return;
        }
        resolve_as_nobody(path, &res);
        assert_int_equal(res.r, -EPERM);
        assert_non_null(strstr(res.why, "closed\" holding \"t.img\" (where a link leads) is not trusted: its "
                                        "POSIX ACL lets user 1234 write it"));
}

/* An ACL entry that lets another user or group write the state directory (its mode's group bits are the mask). */
static void test_statefile_dir_acl(void **state) {
        /* user::rwx user:1234:rwx group::r-x mask::rwx other::--- (little-endian, version 2) */
        unsigned char acl[] = { 2, 0, 0, 0,
                                0x01, 0, 7, 0, 0xff, 0xff, 0xff, 0xff,
                                0x02, 0, 7, 0, 0xd2, 0x04, 0, 0,
                                0x04, 0, 5, 0, 0xff, 0xff, 0xff, 0xff,
                                0x10, 0, 7, 0, 0xff, 0xff, 0xff, 0xff,
                                0x20, 0, 0, 0, 0xff, 0xff, 0xff, 0xff };
        char why[256];

        assert_int_equal(statefile_dir_acl_trusted(acl, sizeof(acl), 0, 0, why, sizeof(why)), -EPERM);
        assert_non_null(strstr(why, "user 1234"));
        assert_int_equal(statefile_dir_acl_trusted(acl, sizeof(acl), 1234, 0, why, sizeof(why)), 0); /* tierd's own */
        acl[30] = 5;                            /* mask::r-x: the named entry may not write */
        assert_int_equal(statefile_dir_acl_trusted(acl, sizeof(acl), 0, 0, why, sizeof(why)), 0);
        acl[30] = 7;
        acl[12] = 0x08;                         /* group:1234:rwx */
        assert_int_equal(statefile_dir_acl_trusted(acl, sizeof(acl), 0, 0, why, sizeof(why)), -EPERM);
        assert_non_null(strstr(why, "group 1234"));
        assert_int_equal(statefile_dir_acl_trusted(acl, sizeof(acl), 0, 1234, why, sizeof(why)), 0);
        acl[14] = 5;                            /* group:1234:r-x */
        assert_int_equal(statefile_dir_acl_trusted(acl, sizeof(acl), 0, 0, why, sizeof(why)), 0);
        /* not an ACL tierd can read: refused, not judged */
        assert_int_equal(statefile_dir_acl_trusted(acl, sizeof(acl) - 1, 0, 0, why, sizeof(why)), -EINVAL);
        acl[0] = 3;
        assert_int_equal(statefile_dir_acl_trusted(acl, sizeof(acl), 0, 0, why, sizeof(why)), -EINVAL);
        assert_int_equal(statefile_dir_acl_trusted(acl, 2, 0, 0, why, sizeof(why)), -EINVAL);
}

/* ---- metrics text ---- */

static void test_metrics_text(void **state) {
        Tier__StatusReply sr = TIER__STATUS_REPLY__INIT;
        Tier__JobStatus job = TIER__JOB_STATUS__INIT, bidi = TIER__JOB_STATUS__INIT, *jobs[] = { &job, &bidi };
        Tier__TargetStatus tg = TIER__TARGET_STATUS__INIT, *tgs[] = { &tg };
        Tier__SmartStatus smart = TIER__SMART_STATUS__INIT;
        Tier__LinkStatus moved = TIER__LINK_STATUS__INIT, *movedp[] = { &moved };
        char *text = NULL;
        size_t len = 0;

        sr.version = (char *) "1.0";
        sr.policy = (char *) "timeline";
        job.name = (char *) "a \"quoted\"\\job\nx";
        job.id = 12;
        job.wear_written = 77;
        job.n_moved = 1;
        job.moved = movedp;
        moved.name = (char *) "host->nvme";
        moved.bytes = 4096;
        sr.n_jobs = 1;
        sr.jobs = jobs;
        tg.path = (char *) "/srv/t.img";
        tg.smart_device = (char *) "/dev/nvme0";
        tg.smart_na = (char *) "";
        tg.smart = &smart;
        smart.data_units_written = 2;
        smart.percentage_used = 150;
        smart.temperature_k = 300;
        sr.n_targets = 1;
        sr.targets = tgs;

        assert_int_equal(metrics_render(&sr, &text, &len), 0);
        assert_int_equal(len, strlen(text));
        assert_true(len > 0 && text[len - 1] == '\n');
        assert_non_null(strstr(text, "# HELP tierd_job_wear_written_bytes_total "));
        assert_non_null(strstr(text, "# TYPE tierd_job_wear_written_bytes_total counter\n"
                                     "tierd_job_wear_written_bytes_total{job_name=\"a \\\"quoted\\\"\\\\job\\nx\"} 77\n"));
        assert_non_null(strstr(text, "tierd_job_moved_bytes_total{job_name=\"a \\\"quoted\\\"\\\\job\\nx\",job_id=\"12\","
                                     "link=\"host->nvme\"} 4096\n"));
        assert_non_null(strstr(text, "tierd_target_smart_available{target=\"/srv/t.img\",device=\"/dev/nvme0\",reason=\"\"} 1\n"));
        assert_non_null(strstr(text, "tierd_target_smart_written_bytes_total{target=\"/srv/t.img\",device=\"/dev/nvme0\"} 1024000\n"));
        assert_non_null(strstr(text, "tierd_target_smart_endurance_used_ratio{target=\"/srv/t.img\",device=\"/dev/nvme0\"} 1.5\n"));
        assert_non_null(strstr(text, "tierd_target_smart_temperature_celsius{target=\"/srv/t.img\",device=\"/dev/nvme0\"} 26.85\n"));
        /* no sched part in this reply: no family for it */
        assert_null(strstr(text, "tierd_sched_"));
        /* every sample's family was announced before it, once */
        for (char *line = text; *line; line = strchr(line, '\n') + 1) {
                char name[128], type_line[160];
                size_t n = strcspn(line, "{ ");

                if (line[0] == '#')
                        continue;
                assert_true(n < sizeof(name));
                (void) snprintf(name, sizeof(name), "%.*s", (int) n, line);
                (void) snprintf(type_line, sizeof(type_line), "# TYPE %s ", name);
                assert_non_null(strstr(text, type_line));
                assert_true(strstr(text, type_line) < line);
        }
        free(text);
        assert_int_equal(metrics_render(NULL, &text, &len), -EINVAL);
}

/*
 * A job name with control or bidirectional format characters (from a tierd
 * older than its name checks) or bytes that are not UTF-8: its label value
 * holds none of them raw but their escaped text, backslash escaped, so the
 * exposition stays
 * valid (promtool's check, when it is installed) and reads back as
 * "evil\u009b31m...", the name tierd restores such a job under.
 */
static void test_metrics_label_controls(void **state) {
        Tier__StatusReply sr = TIER__STATUS_REPLY__INIT;
        Tier__JobStatus job = TIER__JOB_STATUS__INIT, bidi = TIER__JOB_STATUS__INIT, *jobs[] = { &job, &bidi };
        char *text = NULL, path[] = "/tmp/test-wear-metrics-XXXXXX", cmd[256];
        size_t len = 0;
        int fd, status;

        sr.version = (char *) "1.0";
        sr.policy = (char *) "timeline";
        job.name = (char *) "evil\xc2\x9b" "31m\x1b[2J\x7f\xff caf\xc3\xa9 a\\b";
        job.id = 12;
        job.wear_written = 77;
        bidi.name = (char *) "abc\xe2\x80\xae" "gpj.exe";      /* U+202E (RLO): reads "abcexe.jpg" on a terminal */
        bidi.id = 13;
        bidi.wear_written = 78;
        sr.n_jobs = 2;
        sr.jobs = jobs;
        assert_int_equal(metrics_render(&sr, &text, &len), 0);
        assert_non_null(strstr(text, "tierd_job_wear_written_bytes_total{job_name=\"evil\\\\u009b31m\\\\u001b[2J"
                                     "\\\\u007f\\\\xff caf\xc3\xa9 a\\\\b\"} 77\n"));
        assert_non_null(strstr(text, "tierd_job_wear_written_bytes_total{job_name=\"abc\\\\u202egpj.exe\"} 78\n"));
        assert_null(strstr(text, "\xe2\x80\xae"));
        for (const unsigned char *p = (const unsigned char *) text; *p; p++)
                assert_true((*p >= 0x20 || *p == '\n') && *p != 0x7f && *p != 0xff &&
                            !(p[0] == 0xc2 && p[1] >= 0x80 && p[1] <= 0x9f));
        if (system("command -v promtool >/dev/null 2>&1") == 0) {
                fd = mkostemp(path, O_CLOEXEC);
                assert_true(fd >= 0);
                assert_int_equal(write(fd, text, len), (ssize_t) len);
                assert_int_equal(close(fd), 0);
                (void) snprintf(cmd, sizeof(cmd), "promtool check metrics < '%s'", path);
                status = system(cmd);
                (void) unlink(path);
                assert_int_equal(status, 0);
        } else
                print_message("promtool not found (Debian package prometheus): its check is skipped\n");
        free(text);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test_setup_teardown(test_roundtrip, setup, teardown),
                cmocka_unit_test_setup_teardown(test_save_load, setup, teardown),
                cmocka_unit_test_setup_teardown(test_corrupt, setup, teardown),
                cmocka_unit_test_setup_teardown(test_bounded, setup, teardown),
                cmocka_unit_test_setup_teardown(test_statefile, setup, teardown),
                cmocka_unit_test_setup_teardown(test_aside_prune_oldest, setup, teardown),
                cmocka_unit_test_setup_teardown(test_statefile_dir_sync_fails, setup, teardown),
                cmocka_unit_test(test_statefile_dir_trusted),
                cmocka_unit_test_setup_teardown(test_statefile_resolve_trusted, setup, teardown),
                cmocka_unit_test_setup_teardown(test_statefile_resolve_trusted_components, setup, teardown),
                cmocka_unit_test_setup_teardown(test_statefile_resolve_trusted_search_only, setup, teardown),
                cmocka_unit_test(test_statefile_dir_acl),
                cmocka_unit_test(test_metrics_text),
                cmocka_unit_test(test_metrics_label_controls),
        };

        return cmocka_run_group_tests(tests, NULL, NULL);
}
