/* SPDX-License-Identifier: MIT */
/* control.c: the requests of tierctl: the daemon's status and the jobs' quotas. */

/*
 * Theory of operation
 *
 * These are the requests tierd accepts on a control connection (one made
 * with an empty job name), as well as on a job's; each is one
 * transport_call().
 *
 * tier_client_status() asks for a StatusReply and hands it to status_format()
 * (status.c).  A reply too big for one packet comes as a sealed memfd
 * (Response.status_fd) holding the packed message, read here with a bound
 * on its size.  TIER_STATUS_PROMETHEUS is the exception: tierd renders the
 * text itself (daemon/ipc/metrics.c, the same text its [metrics] textfile
 * holds), inline or in a sealed memfd likewise.
 *
 * tierd answers both QuotaGet and QuotaSet with the target's quota as a
 * QuotaReply, checked by quota_reply(), with a target kind (job name, uid,
 * group, default), minima and where each value comes from.  The structs
 * passed in are checked for reserved space and unused level slots left at
 * zero (tier.h's ABI rule).
 */

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <tier.h>

#include "client/client-internal.h"
#include "client/tier-private.h"
#include "proto/macro.h"
#include "proto/tier.pb-c.h"

/* Largest packed StatusReply accepted through status_fd (a few thousand jobs). */
#define CLIENT_STATUS_FD_MAX (64u * 1024u * 1024u)

/*
 * Read all of @fd, a sealed memfd tierd sent (@what: for messages), into a
 * new buffer with a NUL after its *@ret_size bytes.
 */
static int memfd_read_all(tier_client *c, int fd, const char *what, char **ret, size_t *ret_size) {
        _cleanup_free_ char *buf = NULL;
        struct stat st;
        size_t size, done = 0;

        if (fstat(fd, &st) < 0)
                return client_error(c, negative_errno(), "cannot read the %s tierd sent: %m", what);
        if (st.st_size < 0 || (uint64_t) st.st_size > CLIENT_STATUS_FD_MAX)
                return client_error(c, -EFBIG, "%s of %lld bytes is too big", what, (long long) st.st_size);
        size = (size_t) st.st_size;
        buf = malloc(size + 1);
        if (!buf)
                return client_error(c, -ENOMEM, "out of memory reading the %s tierd sent (%zu bytes)", what, size);
        while (done < size) {
                ssize_t n = pread(fd, buf + done, size - done, (off_t) done);
                if (n < 0 && errno == EINTR)
                        continue;
                if (n < 0)
                        return client_error(c, negative_errno(), "cannot read the %s tierd sent: %m", what);
                if (n == 0)
                        return client_error(c, -EPROTO, "%s is shorter than its size", what);
                done += (size_t) n;
        }
        buf[size] = '\0';
        *ret_size = size;
        *ret = TAKE_PTR(buf);
        return 0;
}

/* Read a packed StatusReply from a sealed memfd (status too big for one packet). */
static int status_read_fd(tier_client *c, int fd, Tier__StatusReply **ret) {
        _cleanup_free_ char *buf = NULL;
        size_t size;
        int r;

        r = memfd_read_all(c, fd, "status dump", &buf, &size);
        if (r < 0)
                return r;
        *ret = tier__status_reply__unpack(NULL, size, (const uint8_t *) buf);
        if (!*ret)
                return client_error(c, -EBADMSG, "status dump is malformed");
        return 0;
}

/*
 * Ask tierd for its status and hand the reply to @use(@userdata) (inline in
 * the packet, or read from the memfd tierd sent for a big one).
 */
int status_fetch(tier_client *c, int (*use)(const Tier__StatusReply *, void *), void *userdata) {
        Tier__StatusRequest op = TIER__STATUS_REQUEST__INIT;
        Tier__Request req = TIER__REQUEST__INIT;
        Packet p = PACKET_NULL;
        const Tier__Response *resp;
        Tier__StatusReply *sr = NULL;
        int r;

        req.op_case = TIER__REQUEST__OP_STATUS;
        req.status = &op;
        r = transport_call(c, &req, &p);
        if (r < 0)
                return r;
        resp = p.reply->response;

        if (resp->result_case == TIER__RESPONSE__RESULT_STATUS_REPLY && resp->status_reply) {
                r = use(resp->status_reply, userdata);
        } else if (resp->result_case == TIER__RESPONSE__RESULT_STATUS_FD) {
                _cleanup_close_ int fd = packet_take_fd(&p, resp->status_fd);

                if (fd < 0)
                        r = client_error(c, fd, "status names fd %d, which the packet lacks", resp->status_fd);
                else
                        r = status_read_fd(c, fd, &sr);
                if (r >= 0)
                        r = use(sr, userdata);
                if (sr)
                        tier__status_reply__free_unpacked(sr, NULL);
        } else {
                r = client_error(c, -EPROTO, "tierd answered status without a result");
        }
        packet_done(&p);
        return r;
}

/* Read @fd, a sealed memfd of Prometheus text, into a NUL-terminated buffer. */
static int metrics_read_fd(tier_client *c, int fd, char **ret) {
        size_t size;

        return memfd_read_all(c, fd, "metrics text", ret, &size);
}

/* The status as Prometheus text, rendered by tierd (StatusRequest.prometheus). */
static int metrics_fetch(tier_client *c, char **ret) {
        Tier__StatusRequest op = TIER__STATUS_REQUEST__INIT;
        Tier__Request req = TIER__REQUEST__INIT;
        Packet p = PACKET_NULL;
        const Tier__Response *resp;
        int r;

        op.prometheus = 1;
        req.op_case = TIER__REQUEST__OP_STATUS;
        req.status = &op;
        r = transport_call(c, &req, &p);
        if (r < 0)
                return r;
        resp = p.reply->response;
        if (resp->result_case == TIER__RESPONSE__RESULT_METRICS_TEXT && resp->metrics_text) {
                *ret = strdup(resp->metrics_text);
                r = *ret ? 0 : client_error(c, -ENOMEM, "out of memory copying the metrics text tierd sent");
        } else if (resp->result_case == TIER__RESPONSE__RESULT_METRICS_FD) {
                _cleanup_close_ int fd = packet_take_fd(&p, resp->metrics_fd);

                if (fd < 0)
                        r = client_error(c, fd, "metrics name fd %d, which the packet lacks", resp->metrics_fd);
                else
                        r = metrics_read_fd(c, fd, ret);
        } else if (resp->result_case == TIER__RESPONSE__RESULT_STATUS_REPLY ||
                   resp->result_case == TIER__RESPONSE__RESULT_STATUS_FD) {
                r = client_error(c, -EOPNOTSUPP, "this tierd is too old to give Prometheus metrics "
                                 "(it answered with its plain status); upgrade and restart it");
        } else {
                r = client_error(c, -EPROTO, "tierd answered a metrics request without a result");
        }
        packet_done(&p);
        return r;
}

typedef struct StatusFormat {
        tier_client *client;
        int format;
        char **ret;
} StatusFormat;

static int use_format(const Tier__StatusReply *sr, void *userdata) {
        StatusFormat *f = userdata;
        int r = status_format(sr, f->format, f->ret);

        if (r < 0)
                return client_error(f->client, r, "cannot format tierd's status: %s", tier_strerror(r));
        return r;
}

_public_ int tier_client_status(tier_client *c, int format, char **ret) {
        StatusFormat f = { c, format, ret };

        if (!c)
                return -EINVAL;
        if (!ret)
                return client_error(c, -EINVAL, "ret is NULL: there is nowhere to store the status");
        if (format == TIER_STATUS_PROMETHEUS)
                return metrics_fetch(c, ret);
        if (format != TIER_STATUS_TABLE && format != TIER_STATUS_JSON)
                return client_error(c, -EINVAL, "%d is not a status format (TIER_STATUS_TABLE, _JSON or "
                                    "_PROMETHEUS)", format);
        return status_fetch(c, use_format, &f);
}

typedef struct Moved {
        tier_client *client;
        uint64_t *bytes;
} Moved;

static int use_moved(const Tier__StatusReply *sr, void *userdata) {
        Moved *m = userdata;

        for (size_t i = 0; i < sr->n_jobs; i++) {
                const Tier__JobStatus *j = sr->jobs[i];

                if (!j || j->id != m->client->job_id)
                        continue;
                for (size_t l = 0; l < j->n_moved; l++) {
                        const Tier__LinkStatus *ls = j->moved[l];

                        for (int k = 0; ls && ls->name && k < TIER_LINKS; k++)
                                if (strcmp(ls->name, tier_link_name(k)) == 0)
                                        m->bytes[k] = ls->bytes;
                }
                return 0;
        }
        return client_error(m->client, -ENOENT, "tierd's status has no job %" PRIu64, m->client->job_id);
}

_public_ int tier_client_moved(tier_client *c, uint64_t bytes[TIER_LINK_SLOTS]) {
        uint64_t moved[TIER_LINK_SLOTS] = {};
        Moved m = { c, moved };
        int r;

        if (!c)
                return -EINVAL;
        if (!bytes)
                return client_error(c, -EINVAL, "bytes is NULL: there is nowhere to store the bytes moved");
        r = status_fetch(c, use_moved, &m);
        if (r < 0)
                return r;       /* @bytes left alone (libtier(3)) */
        memcpy(bytes, moved, sizeof(moved));
        return r;
}

/* Copy @s into the fixed-size @buf, cut short if it must be. */
static void copy_text(char *buf, size_t size, const char *s) {
        (void) snprintf(buf, size, "%s", s ? s : "");
}

static int quota_reply(tier_client *c, Packet *pk, struct tier_quota *ret) {
        const Tier__Response *resp = pk->reply->response;
        const Tier__QuotaReply *q = resp->quota;

        if (resp->result_case != TIER__RESPONSE__RESULT_QUOTA || !q) {
                packet_done(pk);
                return client_error(c, -EPROTO, "tierd answered the quota request without a result");
        }
        if (ret) {
                memset(ret, 0, sizeof(*ret));
                for (size_t i = 0; i < TIER_LEVEL_MAX; i++) {
                        ret->max[i] = i < q->n_tier_limit ? q->tier_limit[i] : 0;
                        ret->min[i] = i < q->n_tier_min ? q->tier_min[i] : 0;
                        copy_text(ret->max_from[i], sizeof(ret->max_from[i]), i < q->n_limit_from ? q->limit_from[i] : "");
                        copy_text(ret->min_from[i], sizeof(ret->min_from[i]), i < q->n_min_from ? q->min_from[i] : "");
                }
                ret->min_set = (1u << TIER_LEVEL_MAX) - 1;
                ret->weight = q->weight;
                ret->running = q->running;
                copy_text(ret->weight_from, sizeof(ret->weight_from), q->weight_from);
                copy_text(ret->warning, sizeof(ret->warning), q->warning);
        }
        packet_done(pk);
        return 0;
}

static int quota_kind_ok(int kind, bool set) {
        return kind == TIER_QUOTA_JOB || kind == TIER_QUOTA_UID || kind == TIER_QUOTA_GROUP ||
               (!set && kind == TIER_QUOTA_DEFAULT);
}

_public_ int tier_quota_get(tier_client *c, int kind, uint32_t id, const char *job, struct tier_quota *ret) {
        Tier__Request req = TIER__REQUEST__INIT;
        Tier__QuotaGet q = TIER__QUOTA_GET__INIT;
        Packet pk = PACKET_NULL;
        int r;

        if (!c)
                return -EINVAL;
        if (!ret)
                return client_error(c, -EINVAL, "ret is NULL: there is nowhere to store the quota");
        if (!quota_kind_ok(kind, false))
                return client_error(c, -EINVAL, "%d is not a quota kind (TIER_QUOTA_JOB, _UID, _GROUP or "
                                    "_DEFAULT)", kind);
        q.job = (char *) (kind == TIER_QUOTA_JOB && job ? job : "");
        q.kind = (uint32_t) kind;
        q.id = kind == TIER_QUOTA_UID || kind == TIER_QUOTA_GROUP ? id : 0;
        req.op_case = TIER__REQUEST__OP_QUOTA_GET;
        req.quota_get = &q;
        r = transport_call(c, &req, &pk);
        if (r < 0)
                return r;
        return quota_reply(c, &pk, ret);
}

/* Whether @zero's @n bytes are all 0: the reserved space and unused slots of a struct passed in. */
static bool all_zero(const void *zero, size_t n) {
        const uint8_t *p = zero;

        for (size_t i = 0; i < n; i++)
                if (p[i])
                        return false;
        return true;
}

_public_ int tier_quota_set(tier_client *c, int kind, uint32_t id, const char *job, const struct tier_quota *quota,
                            struct tier_quota *ret) {
        Tier__Request req = TIER__REQUEST__INIT;
        Tier__QuotaSet q = TIER__QUOTA_SET__INIT;
        Packet pk = PACKET_NULL;
        uint64_t limits[TIER_LEVEL_MAX], mins[TIER_LEVEL_MAX];
        int r;

        if (!c)
                return -EINVAL;
        if (!quota)
                return client_error(c, -EINVAL, "quota is NULL: there is no quota to set");
        if (!quota_kind_ok(kind, true))
                return client_error(c, -EINVAL, "%d is not a quota kind that can be set (TIER_QUOTA_JOB, _UID "
                                    "or _GROUP)", kind);
        if (kind == TIER_QUOTA_JOB && (!job || !*job))
                return client_error(c, -EINVAL, "a TIER_QUOTA_JOB quota needs a job name");
        if (quota->min_set & ~((1u << TIER_LEVEL_MAX) - 1))
                return client_error(c, -EINVAL, "min_set %#x names levels past TIER_LEVEL_MAX (%d)",
                                    quota->min_set, TIER_LEVEL_MAX);
        if (!all_zero(quota->reserved, sizeof(quota->reserved)) ||
            !all_zero(quota->max + TIER_LEVEL_MAX, sizeof(quota->max) - TIER_LEVEL_MAX * sizeof(quota->max[0])) ||
            !all_zero(quota->min + TIER_LEVEL_MAX, sizeof(quota->min) - TIER_LEVEL_MAX * sizeof(quota->min[0])))
                return client_error(c, -EINVAL, "struct tier_quota has reserved space or unused level slots that "
                                                "are not zero: start from struct tier_quota q = {0}");
        for (int i = 0; i < TIER_LEVEL_MAX; i++) {
                limits[i] = quota->max[i];
                mins[i] = quota->min[i];
        }
        q.job = (char *) (kind == TIER_QUOTA_JOB ? job : "");
        q.kind = (uint32_t) kind;
        q.id = kind == TIER_QUOTA_JOB ? 0 : id;
        q.n_tier_limit = TIER_LEVEL_MAX;
        q.tier_limit = limits;
        q.n_tier_min = TIER_LEVEL_MAX;
        q.tier_min = mins;
        q.min_set = quota->min_set;
        q.weight = quota->weight;
        q.clear = quota->clear != 0;
        req.op_case = TIER__REQUEST__OP_QUOTA_SET;
        req.quota_set = &q;
        r = transport_call(c, &req, &pk);
        if (r < 0)
                return r;
        return quota_reply(c, &pk, ret);
}

static int quota_total_reply(tier_client *c, Packet *pk, struct tier_quota_total *ret) {
        const Tier__Response *resp = pk->reply->response;
        const Tier__QuotaReply *q = resp->quota;

        if (resp->result_case != TIER__RESPONSE__RESULT_QUOTA || !q) {
                packet_done(pk);
                return client_error(c, -EPROTO, "tierd answered the quota request without a result");
        }
        if (ret) {
                memset(ret, 0, sizeof(*ret));
                for (size_t i = 0; i < TIER_LEVEL_MAX; i++) {
                        ret->total[i] = i < q->n_tier_total ? q->tier_total[i] : 0;
                        ret->used[i] = i < q->n_total_used ? q->total_used[i] : 0;
                        copy_text(ret->from[i], sizeof(ret->from[i]), i < q->n_total_from ? q->total_from[i] : "");
                }
        }
        packet_done(pk);
        return 0;
}

_public_ int tier_quota_total_get(tier_client *c, int kind, uint32_t id, struct tier_quota_total *ret) {
        Tier__Request req = TIER__REQUEST__INIT;
        Tier__QuotaGet q = TIER__QUOTA_GET__INIT;
        Packet pk = PACKET_NULL;
        int r;

        if (!c)
                return -EINVAL;
        if (!ret)
                return client_error(c, -EINVAL, "ret is NULL: there is nowhere to store the total");
        if (kind != TIER_QUOTA_UID && kind != TIER_QUOTA_GROUP)
                return client_error(c, -EINVAL, "%d is not a kind with a total (TIER_QUOTA_UID or _GROUP)", kind);
        q.job = (char *) "";
        q.kind = (uint32_t) kind;
        q.id = id;
        req.op_case = TIER__REQUEST__OP_QUOTA_GET;
        req.quota_get = &q;
        r = transport_call(c, &req, &pk);
        if (r < 0)
                return r;
        return quota_total_reply(c, &pk, ret);
}

_public_ int tier_quota_total_set(tier_client *c, int kind, uint32_t id, const uint64_t total[TIER_LEVEL_SLOTS],
                                  unsigned total_set, struct tier_quota_total *ret) {
        Tier__Request req = TIER__REQUEST__INIT;
        Tier__QuotaSet q = TIER__QUOTA_SET__INIT;
        Packet pk = PACKET_NULL;
        uint64_t totals[TIER_LEVEL_MAX];
        int r;

        if (!c)
                return -EINVAL;
        if (!total)
                return client_error(c, -EINVAL, "total is NULL: there is no total to set");
        if (total_set == 0 || (total_set & ~((1u << TIER_LEVEL_MAX) - 1)))
                return client_error(c, -EINVAL, "total_set %#x must name at least one level and none past "
                                    "TIER_LEVEL_MAX (%d)", total_set, TIER_LEVEL_MAX);
        if (kind != TIER_QUOTA_UID && kind != TIER_QUOTA_GROUP)
                return client_error(c, -EINVAL, "%d is not a kind with a total (TIER_QUOTA_UID or _GROUP)", kind);
        if (!all_zero(total + TIER_LEVEL_MAX, (TIER_LEVEL_SLOTS - TIER_LEVEL_MAX) * sizeof(total[0])))
                return client_error(c, -EINVAL, "total[] has unused level slots (past TIER_LEVEL_MAX) that "
                                                "are not zero");
        for (int i = 0; i < TIER_LEVEL_MAX; i++)
                totals[i] = total_set & (1u << i) ? total[i] : 0;
        q.job = (char *) "";
        q.kind = (uint32_t) kind;
        q.id = id;
        q.n_tier_total = TIER_LEVEL_MAX;
        q.tier_total = totals;
        q.total_set = total_set;
        req.op_case = TIER__REQUEST__OP_QUOTA_SET;
        req.quota_set = &q;
        r = transport_call(c, &req, &pk);
        if (r < 0)
                return r;
        return quota_total_reply(c, &pk, ret);
}
