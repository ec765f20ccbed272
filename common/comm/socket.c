/* Socket backend: one process per rank, a star through rank 0 over TCP.
 *
 * Rendezvous: rank 0 listens on addr; every other rank connects (retrying until the timeout)
 * and sends a hello (magic, version, rank, n_ranks, byte-order probe). Rank 0 answers a bad
 * hello at once with a refusal, and answers the good ones only when all n - 1 ranks are in,
 * so create returns on every rank once the group is complete.
 *
 * Collectives: every message is a 24-byte header (magic, op | root << 8, sequence number,
 * payload length; little-endian) and the payload (native byte order: all ranks run on one
 * architecture, which the hello checks). The non-root ranks send to rank 0; rank 0 reads all
 * of them at once into staging buffers, sums in rank order (rank 0's values + rank 1's + ...)
 * and sends the result back to everyone, so every rank gets the same bits.
 *
 * Every wait is a poll bounded by the handle's timeout (measured from the last byte that
 * moved, so a large transfer that keeps moving is not cut off). Any failure - a peer that
 * closes, dies, stalls, or sends something unexpected - logs the rank, breaks the group and
 * closes every connection, so the other ranks see it at once instead of at their timeout. */
#include "common/comm/comm_internal.h"

#include "common/log.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#ifndef MSG_NOSIGNAL
#define MSG_NOSIGNAL 0 /* then SO_NOSIGPIPE is set on each socket */
#endif

#define WIRE_MAGIC 0x4d435442u /* "BTCM" */
#define WIRE_VERSION 1u
#define BYTE_ORDER_PROBE 0x01020304u
enum { HDR_BYTES = 24, HELLO_BYTES = 24 };
enum { OP_ALL_REDUCE_F32 = 1, OP_ALL_GATHER, OP_BROADCAST, OP_BARRIER };
enum { HELLO_OK = 0, HELLO_BAD_RANK = 1, HELLO_BAD_SIZE = 2, HELLO_DUPLICATE = 3 };

typedef struct {
    bt_comm_t base;
    int *fds; /* by rank: rank 0 holds fds[1..n-1], the others fds[0]; -1 when closed */
    bool broken;
    uint64_t seq;
    unsigned char *stage;
    size_t stage_cap;
} scomm_t;

static const char *op_name(uint32_t tag)
{
    switch (tag & 0xff) {
    case OP_ALL_REDUCE_F32: return "all_reduce_f32";
    case OP_ALL_GATHER: return "all_gather";
    case OP_BROADCAST: return "broadcast";
    case OP_BARRIER: return "barrier";
    default: return "?";
    }
}

static void put_u32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static void put_u64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static uint32_t get_u32(const unsigned char *p)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
    return v;
}

static uint64_t get_u64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static void close_fd(int *fd)
{
    if (*fd >= 0) close(*fd);
    *fd = -1;
}

/* Every later call fails; peers blocked on us see the connections close now. */
static void break_group(scomm_t *s)
{
    s->broken = true;
    for (int r = 0; r < s->base.n_ranks; r++)
        if (s->fds[r] >= 0) {
            shutdown(s->fds[r], SHUT_RDWR);
            close_fd(&s->fds[r]);
        }
}

static int socket_setup(int fd)
{
    int one = 1;
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0) return -1;
    if (fcntl(fd, F_SETFD, FD_CLOEXEC) < 0) return -1;
    /* small messages (barriers, decode-sized all-reduces) must not wait for Nagle */
    if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) < 0) return -1;
#ifdef SO_NOSIGPIPE
    setsockopt(fd, SOL_SOCKET, SO_NOSIGPIPE, &one, sizeof one);
#endif
    return 0;
}

/* ---- collective transfers --------------------------------------------------------------- */

typedef struct {
    int peer;
    bool send;
    bool checked; /* receive: header verified */
    unsigned char hdr[HDR_BYTES];
    uint32_t tag;
    uint64_t seq;
    unsigned char *data;
    size_t len;  /* payload bytes */
    size_t done; /* of HDR_BYTES + len */
} xfer_t;

static void xfer_init(xfer_t *x, int peer, bool send, uint32_t tag, uint64_t seq, void *data,
                      size_t len)
{
    *x = (xfer_t){.peer = peer, .send = send, .tag = tag, .seq = seq, .data = data, .len = len};
    put_u32(x->hdr, WIRE_MAGIC);
    put_u32(x->hdr + 4, tag);
    put_u64(x->hdr + 8, seq);
    put_u64(x->hdr + 16, len);
}

/* Moves what it can without blocking: 1 progress, 0 nothing to do now, -1 failed (logged). */
static int xfer_step(scomm_t *s, xfer_t *x)
{
    const char *op = op_name(x->tag);
    struct iovec iov[2];
    int n_iov = 0;
    if (x->done < HDR_BYTES) iov[n_iov++] = (struct iovec){x->hdr + x->done, HDR_BYTES - x->done};
    if (x->len) {
        size_t off = x->done > HDR_BYTES ? x->done - HDR_BYTES : 0;
        iov[n_iov++] = (struct iovec){x->data + off, x->len - off};
    }
    struct msghdr msg = {.msg_iov = iov, .msg_iovlen = (size_t)n_iov};
    ssize_t n;
    do {
        n = x->send ? sendmsg(s->fds[x->peer], &msg, MSG_NOSIGNAL | MSG_DONTWAIT)
                    : recvmsg(s->fds[x->peer], &msg, MSG_DONTWAIT);
    } while (n < 0 && errno == EINTR);
    if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
        if (errno == EPIPE || errno == ECONNRESET)
            BT_LOG_ERROR("comm(socket): rank %d: rank %d closed the connection during %s",
                         s->base.rank, x->peer, op);
        else
            BT_LOG_ERROR("comm(socket): rank %d: %s with rank %d failed during %s: %s",
                         s->base.rank, x->send ? "send" : "recv", x->peer, op, strerror(errno));
        return -1;
    }
    if (n == 0 && !x->send) {
        BT_LOG_ERROR("comm(socket): rank %d: rank %d closed the connection during %s",
                     s->base.rank, x->peer, op);
        return -1;
    }
    x->done += (size_t)n;
    if (!x->send && !x->checked && x->done >= HDR_BYTES) {
        x->checked = true;
        uint32_t magic = get_u32(x->hdr), tag = get_u32(x->hdr + 4);
        uint64_t seq = get_u64(x->hdr + 8), len = get_u64(x->hdr + 16);
        if (magic != WIRE_MAGIC || tag != x->tag || seq != x->seq || len != x->len) {
            BT_LOG_ERROR("comm(socket): rank %d: ranks disagree: rank %d sent %s #%llu of %llu "
                         "bytes, expected %s #%llu of %zu bytes (root %u)",
                         s->base.rank, x->peer, op_name(tag), (unsigned long long)seq,
                         (unsigned long long)len, op, (unsigned long long)x->seq, x->len,
                         x->tag >> 8);
            return -1;
        }
    }
    return 1;
}

/* Runs transfers with distinct peers to completion, all at once. Fails when one fails or when
 * nothing moved for the timeout; either way the group is broken. */
static bt_status_t xfer_run(scomm_t *s, xfer_t *xs, int nx)
{
    struct pollfd pfd[nx > 0 ? nx : 1];
    int which[nx > 0 ? nx : 1];
    int64_t last = bt__comm_now_ms();
    for (;;) {
        int k = 0;
        for (int i = 0; i < nx; i++) {
            if (xs[i].done == HDR_BYTES + xs[i].len) continue;
            pfd[k] = (struct pollfd){.fd = s->fds[xs[i].peer], .events = xs[i].send ? POLLOUT : POLLIN};
            which[k++] = i;
        }
        if (k == 0) return BT_OK;
        int64_t wait = last + s->base.timeout_ms - bt__comm_now_ms();
        if (wait <= 0) {
            char ranks[256] = "";
            size_t len = 0;
            for (int j = 0; j < k && len < sizeof ranks - 12; j++)
                len += (size_t)snprintf(ranks + len, sizeof ranks - len, " %d", xs[which[j]].peer);
            BT_LOG_ERROR("comm(socket): rank %d: no progress for %d ms in %s, waiting on rank(s)%s",
                         s->base.rank, s->base.timeout_ms, op_name(xs[which[0]].tag), ranks);
            goto fail;
        }
        int rc = poll(pfd, (nfds_t)k, wait > 1000000 ? 1000000 : (int)wait);
        if (rc < 0) {
            if (errno == EINTR) continue;
            BT_LOG_ERROR("comm(socket): rank %d: poll: %s", s->base.rank, strerror(errno));
            goto fail;
        }
        for (int j = 0; j < k && rc > 0; j++) {
            if (!pfd[j].revents) continue;
            int got;
            while ((got = xfer_step(s, &xs[which[j]])) > 0) {
                last = bt__comm_now_ms();
                if (xs[which[j]].done == HDR_BYTES + xs[which[j]].len) break;
            }
            if (got < 0) goto fail;
        }
    }
fail:
    break_group(s);
    return BT_ERR_PEER;
}

static bt_status_t begin(scomm_t *s, uint32_t *tag_p, uint64_t *seq_p, uint32_t op, int root)
{
    if (s->broken) return BT_ERR_PEER;
    *tag_p = op | (uint32_t)root << 8;
    *seq_p = ++s->seq;
    return BT_OK;
}

/* Rank 0's side of "everyone sends me their part": peer q's len bytes land at
 * base + (q - first) * len. */
static bt_status_t root_recv_all(scomm_t *s, uint32_t tag, uint64_t seq, void *base, int first,
                                 size_t len)
{
    int n = s->base.n_ranks;
    xfer_t xs[n];
    for (int q = 1; q < n; q++)
        xfer_init(&xs[q - 1], q, false, tag, seq,
                  len ? (unsigned char *)base + (size_t)(q - first) * len : NULL, len);
    return xfer_run(s, xs, n - 1);
}

/* Rank 0 sends the same payload to every other rank except `skip`. */
static bt_status_t root_send_all(scomm_t *s, uint32_t tag, uint64_t seq, void *data, size_t len,
                                 int skip)
{
    int n = s->base.n_ranks, k = 0;
    xfer_t xs[n];
    for (int q = 1; q < n; q++)
        if (q != skip) xfer_init(&xs[k++], q, true, tag, seq, data, len);
    return xfer_run(s, xs, k);
}

static bt_status_t one(scomm_t *s, int peer, bool send, uint32_t tag, uint64_t seq, void *data,
                       size_t len)
{
    xfer_t x;
    xfer_init(&x, peer, send, tag, seq, data, len);
    return xfer_run(s, &x, 1);
}

static bt_status_t s_all_reduce_f32(bt_comm_t *c, float *buf, size_t n)
{
    scomm_t *s = (scomm_t *)c;
    uint32_t tag;
    uint64_t seq;
    bt_status_t st = begin(s, &tag, &seq, OP_ALL_REDUCE_F32, 0);
    if (st != BT_OK) return st;
    size_t bytes = n * sizeof(float);
    if (c->rank != 0) {
        st = one(s, 0, true, tag, seq, buf, bytes);
        if (st == BT_OK) st = one(s, 0, false, tag, seq, buf, bytes);
        return st;
    }
    int nr = c->n_ranks;
    size_t need = bytes * (size_t)(nr - 1);
    if (nr > 1 && need / (size_t)(nr - 1) != bytes) {
        break_group(s);
        return BT_ERR_NO_MEMORY;
    }
    if (need > s->stage_cap) {
        unsigned char *p = realloc(s->stage, need);
        if (!p) {
            BT_LOG_ERROR("comm(socket): rank 0: no memory for %zu staging bytes", need);
            break_group(s);
            return BT_ERR_NO_MEMORY;
        }
        s->stage = p;
        s->stage_cap = need;
    }
    st = root_recv_all(s, tag, seq, s->stage, 1, bytes);
    if (st != BT_OK) return st;
    for (int q = 1; q < nr && n; q++) {
        const float *b = (const float *)(s->stage + (size_t)(q - 1) * bytes);
        for (size_t i = 0; i < n; i++) buf[i] += b[i];
    }
    return root_send_all(s, tag, seq, buf, bytes, -1);
}

static bt_status_t s_all_gather(bt_comm_t *c, const void *send, size_t bytes, void *recv)
{
    scomm_t *s = (scomm_t *)c;
    uint32_t tag;
    uint64_t seq;
    bt_status_t st = begin(s, &tag, &seq, OP_ALL_GATHER, 0);
    if (st != BT_OK) return st;
    size_t total = bytes * (size_t)c->n_ranks;
    if (c->rank != 0) {
        st = one(s, 0, true, tag, seq, (void *)send, bytes);
        if (st == BT_OK) st = one(s, 0, false, tag, seq, recv, total);
        return st;
    }
    if (bytes && send != recv) memmove(recv, send, bytes);
    st = root_recv_all(s, tag, seq, recv, 0, bytes);
    if (st != BT_OK) return st;
    return root_send_all(s, tag, seq, recv, total, -1);
}

static bt_status_t s_broadcast(bt_comm_t *c, void *buf, size_t bytes, int root)
{
    scomm_t *s = (scomm_t *)c;
    uint32_t tag;
    uint64_t seq;
    bt_status_t st = begin(s, &tag, &seq, OP_BROADCAST, root);
    if (st != BT_OK) return st;
    if (c->rank == 0) {
        if (root != 0 && (st = one(s, root, false, tag, seq, buf, bytes)) != BT_OK) return st;
        return root_send_all(s, tag, seq, buf, bytes, root);
    }
    return one(s, 0, c->rank == root, tag, seq, buf, bytes);
}

static bt_status_t s_barrier(bt_comm_t *c)
{
    scomm_t *s = (scomm_t *)c;
    uint32_t tag;
    uint64_t seq;
    bt_status_t st = begin(s, &tag, &seq, OP_BARRIER, 0);
    if (st != BT_OK) return st;
    if (c->rank != 0) {
        st = one(s, 0, true, tag, seq, NULL, 0);
        if (st == BT_OK) st = one(s, 0, false, tag, seq, NULL, 0);
        return st;
    }
    st = root_recv_all(s, tag, seq, NULL, 1, 0);
    if (st != BT_OK) return st;
    return root_send_all(s, tag, seq, NULL, 0, -1);
}

static void s_destroy(bt_comm_t *c)
{
    scomm_t *s = (scomm_t *)c;
    for (int r = 0; r < c->n_ranks; r++) close_fd(&s->fds[r]);
    free(s->fds);
    free(s->stage);
    free(s);
}

static const bt__comm_ops_t socket_ops = {
    .name = "socket",
    .all_reduce_f32 = s_all_reduce_f32,
    .all_gather = s_all_gather,
    .broadcast = s_broadcast,
    .barrier = s_barrier,
    .destroy = s_destroy,
};

/* ---- rendezvous ------------------------------------------------------------------------- */

/* Blocking-style full read or write of a non-blocking socket until deadline_ms:
 * BT_OK, BT_ERR_PEER (closed / error) or BT_ERR_DEADLINE. */
static bt_status_t io_full(int fd, void *buf, size_t len, bool send, int64_t deadline_ms)
{
    unsigned char *p = buf;
    while (len) {
        ssize_t n = send ? sendto(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT, NULL, 0)
                         : recv(fd, p, len, MSG_DONTWAIT);
        if (n > 0) {
            p += n, len -= (size_t)n;
            continue;
        }
        if (n == 0 && !send) return BT_ERR_PEER;
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return BT_ERR_PEER;
        int64_t wait = deadline_ms - bt__comm_now_ms();
        if (wait <= 0) return BT_ERR_DEADLINE;
        struct pollfd pfd = {.fd = fd, .events = send ? POLLOUT : POLLIN};
        if (poll(&pfd, 1, wait > 1000000 ? 1000000 : (int)wait) < 0 && errno != EINTR)
            return BT_ERR_PEER;
    }
    return BT_OK;
}

static void hello_encode(unsigned char *p, int rank, int n_ranks, uint32_t status)
{
    put_u32(p, WIRE_MAGIC);
    put_u32(p + 4, WIRE_VERSION);
    put_u32(p + 8, (uint32_t)rank);
    put_u32(p + 12, (uint32_t)n_ranks);
    uint32_t probe = BYTE_ORDER_PROBE; /* native order: a peer of the other endianness differs */
    memcpy(p + 16, &probe, 4);
    put_u32(p + 20, status);
}

static bool hello_compatible(const unsigned char *p)
{
    uint32_t probe;
    memcpy(&probe, p + 16, 4);
    return get_u32(p) == WIRE_MAGIC && get_u32(p + 4) == WIRE_VERSION && probe == BYTE_ORDER_PROBE;
}

static bt_status_t parse_addr(const char *addr, char *host, size_t host_cap, char *port,
                              size_t port_cap)
{
    const char *colon = addr ? strrchr(addr, ':') : NULL;
    if (!colon || !colon[1]) return BT_ERR_INVALID_ARG;
    const char *h = addr;
    size_t hl = (size_t)(colon - addr);
    if (hl >= 2 && h[0] == '[' && h[hl - 1] == ']') h++, hl -= 2;
    if (hl == 0 || hl >= host_cap || strlen(colon + 1) >= port_cap) return BT_ERR_INVALID_ARG;
    char *end;
    long p = strtol(colon + 1, &end, 10);
    if (*end || p <= 0 || p > 65535) return BT_ERR_INVALID_ARG;
    memcpy(host, h, hl);
    host[hl] = '\0';
    snprintf(port, port_cap, "%ld", p);
    return BT_OK;
}

static bt_status_t rendezvous_root(scomm_t *s, const char *host, const char *port, int64_t deadline)
{
    int n = s->base.n_ranks;
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *ai = NULL;
    int gai = getaddrinfo(host, port, &hints, &ai);
    if (gai != 0) {
        BT_LOG_ERROR("comm(socket): rank 0: cannot resolve %s: %s", host, gai_strerror(gai));
        return BT_ERR_INVALID_ARG;
    }
    int lfd = -1, err = 0;
    for (struct addrinfo *a = ai; a && lfd < 0; a = a->ai_next) {
        lfd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
        if (lfd < 0) {
            err = errno;
            continue;
        }
        int one = 1;
        setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(lfd, a->ai_addr, a->ai_addrlen) < 0 || listen(lfd, n) < 0 ||
            fcntl(lfd, F_SETFL, O_NONBLOCK) < 0 || fcntl(lfd, F_SETFD, FD_CLOEXEC) < 0) {
            err = errno;
            close_fd(&lfd);
        }
    }
    freeaddrinfo(ai);
    if (lfd < 0) {
        BT_LOG_ERROR("comm(socket): rank 0: cannot listen on %s:%s: %s", host, port, strerror(err));
        return BT_ERR_IO;
    }

    bt_status_t st = BT_OK;
    int joined = 0;
    while (joined < n - 1) {
        int64_t wait = deadline - bt__comm_now_ms();
        if (wait <= 0) {
            char missing[256] = "";
            size_t len = 0;
            for (int r = 1; r < n && len < sizeof missing - 12; r++)
                if (s->fds[r] < 0)
                    len += (size_t)snprintf(missing + len, sizeof missing - len, " %d", r);
            BT_LOG_ERROR("comm(socket): rank 0: rank(s)%s did not join on %s:%s in time", missing,
                         host, port);
            st = BT_ERR_PEER;
            break;
        }
        struct pollfd pfd = {.fd = lfd, .events = POLLIN};
        if (poll(&pfd, 1, wait > 1000000 ? 1000000 : (int)wait) <= 0) continue;
        int fd = accept(lfd, NULL, NULL);
        if (fd < 0) continue;
        unsigned char h[HELLO_BYTES];
        if (socket_setup(fd) < 0 || io_full(fd, h, sizeof h, false, deadline) != BT_OK ||
            !hello_compatible(h)) {
            BT_LOG_WARN("comm(socket): rank 0: dropped a connection without a valid hello");
            close(fd);
            continue;
        }
        uint32_t r = get_u32(h + 8), their_n = get_u32(h + 12), why = HELLO_OK;
        if (their_n != (uint32_t)n) why = HELLO_BAD_SIZE;
        else if (r == 0 || r >= (uint32_t)n) why = HELLO_BAD_RANK;
        else if (s->fds[r] >= 0) why = HELLO_DUPLICATE;
        if (why != HELLO_OK) {
            BT_LOG_ERROR("comm(socket): rank 0: refused a peer claiming rank %u of %u (group of %d%s)",
                         r, their_n, n, why == HELLO_DUPLICATE ? ", rank already joined" : "");
            hello_encode(h, 0, n, why);
            io_full(fd, h, sizeof h, true, deadline);
            close(fd);
            continue;
        }
        s->fds[r] = fd;
        joined++;
    }
    close(lfd);
    for (int r = 1; r < n && st == BT_OK; r++) {
        unsigned char h[HELLO_BYTES];
        hello_encode(h, 0, n, HELLO_OK);
        if (io_full(s->fds[r], h, sizeof h, true, deadline) != BT_OK) {
            BT_LOG_ERROR("comm(socket): rank 0: rank %d left during the rendezvous", r);
            st = BT_ERR_PEER;
        }
    }
    return st;
}

static bt_status_t connect_once(const char *host, const char *port, int64_t deadline, int *fd_p)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_NUMERICSERV};
    struct addrinfo *ai = NULL;
    if (getaddrinfo(host, port, &hints, &ai) != 0) return BT_ERR_UNAVAILABLE;
    bt_status_t st = BT_ERR_UNAVAILABLE;
    for (struct addrinfo *a = ai; a && st != BT_OK; a = a->ai_next) {
        int fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
        if (fd < 0) continue;
        if (socket_setup(fd) < 0) {
            close(fd);
            continue;
        }
        int rc = connect(fd, a->ai_addr, a->ai_addrlen);
        if (rc < 0 && errno == EINPROGRESS) {
            int64_t wait = deadline - bt__comm_now_ms();
            struct pollfd pfd = {.fd = fd, .events = POLLOUT};
            int err = ETIMEDOUT;
            socklen_t el = sizeof err;
            if (wait > 0 && poll(&pfd, 1, wait > 1000000 ? 1000000 : (int)wait) == 1)
                getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el);
            rc = err ? -1 : 0;
        }
        if (rc == 0) {
            *fd_p = fd;
            st = BT_OK;
        } else {
            close(fd);
        }
    }
    freeaddrinfo(ai);
    return st;
}

static bt_status_t rendezvous_peer(scomm_t *s, const char *host, const char *port, int64_t deadline)
{
    int rank = s->base.rank, n = s->base.n_ranks;
    int fd = -1;
    while (connect_once(host, port, deadline, &fd) != BT_OK) {
        int64_t wait = deadline - bt__comm_now_ms();
        if (wait <= 0) {
            BT_LOG_ERROR("comm(socket): rank %d: rank 0 not reachable at %s:%s in time", rank,
                         host, port);
            return BT_ERR_PEER;
        }
        struct timespec ts = {0, (wait < 50 ? wait : 50) * 1000000L};
        nanosleep(&ts, NULL);
    }
    unsigned char h[HELLO_BYTES];
    hello_encode(h, rank, n, HELLO_OK);
    bt_status_t st = io_full(fd, h, sizeof h, true, deadline);
    if (st == BT_OK) st = io_full(fd, h, sizeof h, false, deadline);
    if (st != BT_OK) {
        BT_LOG_ERROR("comm(socket): rank %d: rank 0 %s during the rendezvous", rank,
                     st == BT_ERR_DEADLINE ? "did not complete the group in time"
                                           : "closed the connection");
        close(fd);
        return BT_ERR_PEER;
    }
    if (!hello_compatible(h) || get_u32(h + 12) != (uint32_t)n || get_u32(h + 20) != HELLO_OK) {
        BT_LOG_ERROR("comm(socket): rank %d: rank 0 refused us (group of %u, reason %u)", rank,
                     get_u32(h + 12), get_u32(h + 20));
        close(fd);
        return BT_ERR_INCOMPATIBLE;
    }
    s->fds[0] = fd;
    return BT_OK;
}

bt_status_t bt_comm_socket_create(int rank, int n_ranks, const char *addr, int timeout_ms,
                                  bt_comm_t **comm_p)
{
    char host[256], port[16];
    if (n_ranks <= 0 || rank < 0 || rank >= n_ranks || timeout_ms <= 0 || !comm_p ||
        parse_addr(addr, host, sizeof host, port, sizeof port) != BT_OK) {
        BT_LOG_ERROR("comm(socket): bad arguments (rank %d of %d, addr \"%s\", timeout %d ms)",
                     rank, n_ranks, addr ? addr : "(null)", timeout_ms);
        return BT_ERR_INVALID_ARG;
    }
    scomm_t *s = calloc(1, sizeof *s);
    if (!s) return BT_ERR_NO_MEMORY;
    s->fds = malloc((size_t)n_ranks * sizeof *s->fds);
    if (!s->fds) {
        free(s);
        return BT_ERR_NO_MEMORY;
    }
    for (int r = 0; r < n_ranks; r++) s->fds[r] = -1;
    s->base = (bt_comm_t){.ops = &socket_ops, .rank = rank, .n_ranks = n_ranks,
                          .timeout_ms = timeout_ms};
    int64_t deadline = bt__comm_now_ms() + timeout_ms;
    bt_status_t st = BT_OK;
    if (n_ranks > 1)
        st = rank == 0 ? rendezvous_root(s, host, port, deadline)
                       : rendezvous_peer(s, host, port, deadline);
    if (st != BT_OK) {
        s_destroy(&s->base);
        return st;
    }
    *comm_p = &s->base;
    return BT_OK;
}
