/* SPDX-License-Identifier: MIT */
/* sandbox-run.c: run a program under the system call restrictions of tierd.service, without systemd. */

/*
 * usage: sandbox-run [--self-test] [--] PROGRAM [ARGS...]
 *
 * Installs a seccomp filter with what the unit's MemoryDenyWriteExecute=yes
 * and RestrictAddressFamilies=AF_UNIX do (the same rules systemd 252
 * installs), then execs PROGRAM:
 *
 *   mmap()                 with PROT_WRITE and PROT_EXEC        -> EPERM
 *   mprotect(), pkey_mprotect() with PROT_EXEC                  -> EPERM
 *   shmat()                with SHM_EXEC                        -> EPERM
 *   socket(), socketpair() of a family other than AF_UNIX       -> EAFNOSUPPORT
 *
 * so that a test (or tests/gpu/run.sh, for the CUDA driver) can show that
 * tierd works inside those limits.  Run it under "setpriv --no-new-privs"
 * (the unit's NoNewPrivileges=yes), or as root.  --self-test checks that
 * the filter refuses what it should, in this process, and exits 0.
 * Exit status 77: seccomp or this architecture is not supported.
 */

#include <errno.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/shm.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#if defined(__x86_64__)
#define NATIVE_ARCH AUDIT_ARCH_X86_64
#elif defined(__aarch64__)
#define NATIVE_ARCH AUDIT_ARCH_AARCH64
#endif

#ifndef SHM_EXEC
#define SHM_EXEC 0100000
#endif

/* The low 32 bits of argument @n (little-endian). */
#define ARG_LO(n) (offsetof(struct seccomp_data, args) + (n) * sizeof(__u64))

#define LOAD(off) BPF_STMT(BPF_LD | BPF_W | BPF_ABS, (off))
#define RET(v) BPF_STMT(BPF_RET | BPF_K, (v))
#define ERRNO(e) RET(SECCOMP_RET_ERRNO | ((e) & SECCOMP_RET_DATA))
#define ALLOW RET(SECCOMP_RET_ALLOW)

#ifdef NATIVE_ARCH
static int install_filter(void) {
        struct sock_filter f[] = {
                LOAD(offsetof(struct seccomp_data, arch)),
                BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, NATIVE_ARCH, 1, 0),
                ALLOW,                                          /* other ABIs: not ours to judge */
                LOAD(offsetof(struct seccomp_data, nr)),
                BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_mmap, 0, 5),
                /* mmap: refuse PROT_WRITE|PROT_EXEC together */
                LOAD(ARG_LO(2)),
                BPF_STMT(BPF_ALU | BPF_AND | BPF_K, PROT_WRITE | PROT_EXEC),
                BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, PROT_WRITE | PROT_EXEC, 0, 1),
                ERRNO(EPERM),
                ALLOW,
                BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_mprotect, 1, 0),
                BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_pkey_mprotect, 0, 4),
                /* mprotect: refuse PROT_EXEC */
                LOAD(ARG_LO(2)),
                BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, PROT_EXEC, 0, 1),
                ERRNO(EPERM),
                ALLOW,
                BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_shmat, 0, 4),
                /* shmat: refuse SHM_EXEC */
                LOAD(ARG_LO(2)),
                BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, SHM_EXEC, 0, 1),
                ERRNO(EPERM),
                ALLOW,
                BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_socket, 1, 0),
                BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_socketpair, 0, 4),
                /* socket, socketpair: AF_UNIX only */
                LOAD(ARG_LO(0)),
                BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AF_UNIX, 1, 0),
                ERRNO(EAFNOSUPPORT),
                ALLOW,
                ALLOW,
        };
        struct sock_fprog prog = { .len = sizeof(f) / sizeof(f[0]), .filter = f };

        if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
                return -errno;
        if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) < 0)
                return -errno;
        return 0;
}
#else
static int install_filter(void) {
        return -EOPNOTSUPP;
}
#endif

static int self_test(void) {
        void *p;
        int fd, bad = 0;

        p = mmap(NULL, 4096, PROT_READ | PROT_WRITE | PROT_EXEC, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p != MAP_FAILED || errno != EPERM) {
                fprintf(stderr, "sandbox-run: mmap(PROT_WRITE|PROT_EXEC) was not refused\n");
                bad = 1;
        }
        p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) {
                fprintf(stderr, "sandbox-run: mmap(PROT_READ|PROT_WRITE) failed: %m\n");
                bad = 1;
        } else if (mprotect(p, 4096, PROT_READ | PROT_EXEC) == 0 || errno != EPERM) {
                fprintf(stderr, "sandbox-run: mprotect(PROT_EXEC) was not refused\n");
                bad = 1;
        }
        fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd >= 0 || errno != EAFNOSUPPORT) {
                fprintf(stderr, "sandbox-run: socket(AF_INET) was not refused\n");
                bad = 1;
        }
        fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
        if (fd < 0) {
                fprintf(stderr, "sandbox-run: socket(AF_UNIX) failed: %m\n");
                bad = 1;
        } else
                close(fd);
        if (!bad)
                printf("sandbox-run: W+X mappings, PROT_EXEC and non-AF_UNIX sockets are refused\n");
        return bad;
}

int main(int argc, char *argv[]) {
        int i = 1, r;
        int test = 0;

        if (i < argc && strcmp(argv[i], "--self-test") == 0) {
                test = 1;
                i++;
        }
        if (i < argc && strcmp(argv[i], "--") == 0)
                i++;
        if (!test && i >= argc) {
                fprintf(stderr, "usage: sandbox-run [--self-test] [--] PROGRAM [ARGS...]\n");
                return 2;
        }

        r = install_filter();
        if (r < 0) {
                fprintf(stderr, "sandbox-run: cannot install the seccomp filter: %s\n", strerror(-r));
                return 77;
        }
        if (test)
                return self_test();
        execvp(argv[i], argv + i);
        fprintf(stderr, "sandbox-run: cannot execute %s: %m\n", argv[i]);
        return 127;
}
