/* The data plane's socket loops in C (data_plane_io.py loads them through ctypes, which
 * releases the GIL for each call). A Python loop over recv/sendmsg takes the GIL back
 * after every syscall, and a socket with a timeout polls before each one; here a whole
 * frame, payload or gather write is one call: the syscall is tried first and poll(2) is
 * used only when it would block. Every call has a deadline (milliseconds, < 0: none).
 *
 * Results: >= 0 success (a length where one is asked for), else one of the DP_ codes
 * below, or -(DP_ERRNO_BASE + errno).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>

#define DP_CLOSED (-1)     /* the peer closed the stream mid-transfer */
#define DP_TIMEOUT (-2)    /* the deadline passed */
#define DP_TOO_LONG (-3)   /* a frame's length is over the caller's limit */
#define DP_ERRNO_BASE 1000 /* -(DP_ERRNO_BASE + errno): a socket error */

static int64_t now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

static int64_t deadline_of(int timeout_ms) { return timeout_ms < 0 ? -1 : now_ms() + timeout_ms; }

/* Waits until `fd` is ready for `events`: 0, DP_TIMEOUT or an errno code. */
static long wait_ready(int fd, short events, int64_t deadline) {
    for (;;) {
        int wait = -1;
        if (deadline >= 0) {
            int64_t left = deadline - now_ms();
            if (left <= 0) return DP_TIMEOUT;
            wait = left > INT_MAX ? INT_MAX : (int)left;
        }
        struct pollfd p = {.fd = fd, .events = events};
        int ready = poll(&p, 1, wait);
        if (ready > 0) return 0;
        if (ready == 0) return DP_TIMEOUT;
        if (errno != EINTR) return -(DP_ERRNO_BASE + errno);
    }
}

/* Drops the first `done` bytes of iov[*first..n). */
static void advance(struct iovec *iov, int n, int *first, size_t done) {
    while (*first < n && done >= iov[*first].iov_len) {
        done -= iov[*first].iov_len;
        (*first)++;
    }
    if (*first < n) {
        iov[*first].iov_base = (char *)iov[*first].iov_base + done;
        iov[*first].iov_len -= done;
    }
}

/* Fills (receiving) or sends the whole of iov[0..n); `iov` is consumed. */
static long move_all(int fd, struct iovec *iov, int n, int receiving, int64_t deadline) {
    int first = 0;
    advance(iov, n, &first, 0); /* skips empty buffers */
    while (first < n) {
        struct msghdr message = {.msg_iov = iov + first, .msg_iovlen = n - first < IOV_MAX ? n - first : IOV_MAX};
        ssize_t moved = receiving ? recvmsg(fd, &message, 0) : sendmsg(fd, &message, MSG_NOSIGNAL);
        if (moved > 0) {
            advance(iov, n, &first, (size_t)moved);
            continue;
        }
        if (moved == 0 && receiving) return DP_CLOSED;
        if (moved < 0 && errno == EINTR) continue;
        if (moved < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            long waited = wait_ready(fd, receiving ? POLLIN : POLLOUT, deadline);
            if (waited) return waited;
            continue;
        }
        return moved < 0 ? -(DP_ERRNO_BASE + errno) : DP_CLOSED;
    }
    return 0;
}

long dp_send(int fd, struct iovec *iov, int n, int timeout_ms) {
    return move_all(fd, iov, n, 0, deadline_of(timeout_ms));
}

long dp_recv(int fd, struct iovec *iov, int n, int timeout_ms) {
    return move_all(fd, iov, n, 1, deadline_of(timeout_ms));
}

/* One frame (uint32 big-endian length, then the body): the body's length, with the body in
 * `buf` when it fits `cap`; a longer body (up to `max_bytes`) is left unread for the
 * caller to receive into a buffer of its length (the result is then > cap). */
long dp_recv_frame(int fd, char *buf, size_t cap, size_t max_bytes, int timeout_ms) {
    int64_t deadline = deadline_of(timeout_ms);
    unsigned char prefix[4];
    struct iovec iov = {.iov_base = prefix, .iov_len = sizeof prefix};
    long status = move_all(fd, &iov, 1, 1, deadline);
    if (status) return status;
    size_t length = (size_t)prefix[0] << 24 | (size_t)prefix[1] << 16 | (size_t)prefix[2] << 8 | prefix[3];
    if (length > max_bytes) return DP_TOO_LONG;
    if (length > cap) return (long)length;
    iov = (struct iovec){.iov_base = buf, .iov_len = length};
    status = move_all(fd, &iov, 1, 1, deadline);
    return status ? status : (long)length;
}

/* Sends `request` (a whole frame), then receives the reply frame as dp_recv_frame: one
 * call for a round trip. */
long dp_exchange(int fd, const char *request, size_t request_bytes, char *buf, size_t cap, size_t max_bytes,
                 int timeout_ms) {
    struct iovec iov = {.iov_base = (void *)request, .iov_len = request_bytes};
    long status = move_all(fd, &iov, 1, 0, deadline_of(timeout_ms));
    return status ? status : dp_recv_frame(fd, buf, cap, max_bytes, timeout_ms);
}
