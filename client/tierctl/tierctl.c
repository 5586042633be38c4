/* SPDX-License-Identifier: MIT */
/* tierctl: command-line control of tierd, built on libtier only. */

/*
 * Every command is one row of the verb table below: adding a command is a
 * function plus one line.  Global options come before the verb; each verb
 * parses its own arguments.  Exit status: 0 ok, 1 failure talking to
 * tierd, 2 bad usage.
 */

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tier.h>

#ifndef TIERD_VERSION
#define TIERD_VERSION "unknown"
#endif

#define EXIT_USAGE 2

static const char *arg_socket = NULL;
static int arg_json = 0;

typedef struct Verb {
        const char *name;
        int (*fn)(int argc, char **argv);
        const char *help;
} Verb;

static int verb_status(int argc, char **argv);
static int verb_help(int argc, char **argv);

static const Verb verbs[] = {
        { "status", verb_status, "show tiers, links, NVMe targets and jobs" },
        { "help",   verb_help,   "show this help" },
};

static void help(FILE *f) {
        fprintf(f,
                "Usage: tierctl [OPTIONS] COMMAND [ARGS]\n"
                "\n"
                "Control tierd, the GPU/host/NVMe memory tier daemon.\n"
                "\n"
                "Options:\n"
                "  --socket PATH   talk to tierd at PATH (default: $TIER_SOCKET, else the built-in path)\n"
                "  --json          print machine-readable JSON\n"
                "  -h, --help      show this help\n"
                "      --version   show the version\n"
                "\n"
                "Commands:\n");
        for (size_t i = 0; i < sizeof(verbs) / sizeof(verbs[0]); i++)
                fprintf(f, "  %-14s  %s\n", verbs[i].name, verbs[i].help);
}

/* Open a control connection (no job), or say why not. */
static int connect_control(tier_client **ret) {
        int r;

        r = tier_client_new(ret, arg_socket, NULL, 0);
        if (r < 0) {
                const char *why = tier_client_last_error(NULL);
                fprintf(stderr, "tierctl: %s\n", why && *why ? why : tier_strerror(r));
                return r;
        }
        return 0;
}

static int verb_status(int argc, char **argv) {
        tier_client *c = NULL;
        char *text = NULL;
        int r;

        for (int i = 1; i < argc; i++) {
                if (strcmp(argv[i], "--json") == 0)
                        arg_json = 1;
                else if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
                        printf("Usage: tierctl status [--json]\n\n%s\n", verbs[0].help);
                        return EXIT_SUCCESS;
                } else {
                        fprintf(stderr, "tierctl status: unexpected argument '%s'\n", argv[i]);
                        return EXIT_USAGE;
                }
        }

        if (connect_control(&c) < 0)
                return EXIT_FAILURE;
        r = tier_status(c, arg_json ? TIER_STATUS_JSON : TIER_STATUS_TABLE, &text);
        if (r < 0) {
                fprintf(stderr, "tierctl: status failed: %s\n",
                        *tier_client_last_error(c) ? tier_client_last_error(c) : tier_strerror(r));
                tier_client_free(c);
                return EXIT_FAILURE;
        }
        fputs(text, stdout);
        free(text);
        tier_client_free(c);
        return fflush(stdout) == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}

static int verb_help(int argc, char **argv) {
        help(stdout);
        return EXIT_SUCCESS;
}

int main(int argc, char **argv) {
        enum { ARG_SOCKET = 0x100, ARG_JSON, ARG_VERSION };
        static const struct option options[] = {
                { "socket",  required_argument, NULL, ARG_SOCKET },
                { "json",    no_argument,       NULL, ARG_JSON },
                { "help",    no_argument,       NULL, 'h' },
                { "version", no_argument,       NULL, ARG_VERSION },
                {}
        };
        int c;

        /* "+": stop at the verb, whose own arguments are its business. */
        while ((c = getopt_long(argc, argv, "+h", options, NULL)) >= 0) {
                switch (c) {
                case ARG_SOCKET:
                        arg_socket = optarg;
                        break;
                case ARG_JSON:
                        arg_json = 1;
                        break;
                case 'h':
                        help(stdout);
                        return EXIT_SUCCESS;
                case ARG_VERSION:
                        printf("tierctl %s (protocol %d)\n", TIERD_VERSION, TIER_PROTOCOL_VERSION);
                        return EXIT_SUCCESS;
                default:
                        /* getopt_long() has said what was wrong. */
                        fprintf(stderr, "(try tierctl --help)\n");
                        return EXIT_USAGE;
                }
        }

        if (optind >= argc) {
                fprintf(stderr, "tierctl: no command given (try --help)\n");
                return EXIT_USAGE;
        }
        for (size_t i = 0; i < sizeof(verbs) / sizeof(verbs[0]); i++)
                if (strcmp(argv[optind], verbs[i].name) == 0)
                        return verbs[i].fn(argc - optind, argv + optind);

        fprintf(stderr, "tierctl: unknown command '%s' (try --help)\n", argv[optind]);
        return EXIT_USAGE;
}
