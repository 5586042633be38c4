/* SPDX-License-Identifier: MIT */
/* bind-swap.c: LD_PRELOAD shim: right after bind() makes a socket file, a link to $TIER_BIND_SWAP takes its place. */

/*
 * What a user who can write the socket's directory could do between tierd's
 * bind() and anything tierd does next by the socket's path (a chmod() by
 * name would follow the link and change the mode of the file it names).
 * Preloaded into tierd, this does it at exactly that point, so that a test
 * needs no race: after a successful bind() of an AF_UNIX path, the socket
 * file is removed and a symbolic link to $TIER_BIND_SWAP made there.  Any
 * other bind() goes to libc unchanged.
 */

#include <dlfcn.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

typedef int (*bind_fn)(int, const struct sockaddr *, socklen_t);

__attribute__((visibility("default"))) int bind(int fd, const struct sockaddr *sa, socklen_t len);
int bind(int fd, const struct sockaddr *sa, socklen_t len) {
        static bind_fn next;
        const char *target = getenv("TIER_BIND_SWAP");
        int r;

        if (!next)
                next = (bind_fn) dlsym(RTLD_NEXT, "bind");
        r = next(fd, sa, len);
        if (r == 0 && target && *target && sa->sa_family == AF_UNIX) {
                const struct sockaddr_un *un = (const struct sockaddr_un *) sa;

                if (un->sun_path[0] != '\0' && unlink(un->sun_path) == 0)
                        (void) symlink(target, un->sun_path);
        }
        return r;
}
