/*
 * Ground truth for ctracer's tests: when CTRACER_SAMPLE_LOG names a file, every method
 * appends one line per object at entry and one just before it returns:
 *
 *   fn=NAME<TAB>file=UNIT<TAB>phase=entry|exit<TAB>tid=N<TAB>depth=N<TAB>slot=N
 *   <TAB>obj=0xADDR<TAB>ret=N|-<TAB>FIELD=VALUE...
 *
 * FIELD is the dotted path of every scalar member of struct sock (anonymous unions add
 * no step); VALUE is decimal, 0x-hex for pointers, raw text for char arrays.  Members of
 * the kernel's complex types are logged twice: their internals, and the values ctracer's
 * collectors record for them (FIELD.held for a spinlock, FIELD.locked for a mutex, the
 * counter under the member's own name for refcount_t and atomics, FIELD.qlen of an
 * sk_buff_head, FIELD.empty of a list_head, FIELD.unhashed of an hlist_node).  No
 * fields follow when obj is 0.  depth counts the methods active on this thread (0 for
 * the outermost).  Each line is one write(2) to an O_APPEND file, so threads do not
 * interleave and a killed process loses nothing already logged.  The logger only
 * reads the objects; it takes them as const void * so that it is not a method itself.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "sock.h"

int gt_fd = -1;
static __thread int gt_depth;

void gt_open(void)
{
	const char *path = getenv("CTRACER_SAMPLE_LOG");

	if (path && *path) {
		gt_fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_TRUNC | O_CLOEXEC, 0644);
		if (gt_fd < 0) {
			perror(path);
			exit(1);
		}
	}
}

struct line {
	char text[4096];
	size_t len;
};

static void add(struct line *l, const char *fmt, ...)
{
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(l->text + l->len, sizeof(l->text) - l->len, fmt, ap);
	va_end(ap);
	if (n > 0)
		l->len += (size_t)n < sizeof(l->text) - l->len ? (size_t)n : 0;
}

static void add_list(struct line *l, const char *name, const struct list_head *h)
{
	add(l, "\t%s.next=%#lx\t%s.prev=%#lx\t%s.empty=%d", name, (unsigned long)h->next,
	    name, (unsigned long)h->prev, name, h->next == h);
}

static void add_complex_fields(struct line *l, const void *obj)
{
	const struct sock *sk = obj;
	const struct sk_buff_head *q = &sk->sk_receive_queue;
	const struct mutex *m = &sk->sk_mutex;

	add(l, "\tsk_drops.counter=%d\tsk_drops=%d", sk->sk_drops.counter, sk->sk_drops.counter);
	add(l, "\tsk_bytes_sent.counter=%lld\tsk_bytes_sent=%lld", sk->sk_bytes_sent.counter,
	    sk->sk_bytes_sent.counter);
	add(l, "\tsk_mem_pages.counter=%lld\tsk_mem_pages=%lld", sk->sk_mem_pages.counter,
	    sk->sk_mem_pages.counter);
	add(l, "\tsk_stamp=%lld", sk->sk_stamp);
	add(l, "\tsk_receive_queue.next=%#lx\tsk_receive_queue.prev=%#lx",
	    (unsigned long)q->next, (unsigned long)q->prev);
	add(l, "\tsk_receive_queue.qlen=%u", q->qlen);
	add(l, "\tsk_receive_queue.lock.locked=%u\tsk_receive_queue.lock.owner=%u",
	    q->lock.locked, q->lock.owner);
	add_list(l, "sk_accept_waiters", &sk->sk_accept_waiters);
	add(l, "\tsk_bind_node.next=%#lx\tsk_bind_node.pprev=%#lx\tsk_bind_node.unhashed=%d",
	    (unsigned long)sk->sk_bind_node.next, (unsigned long)sk->sk_bind_node.pprev,
	    sk->sk_bind_node.pprev == NULL);
	add(l, "\tsk_mutex.owner.counter=%lld\tsk_mutex.locked=%d", m->owner.counter,
	    (m->owner.counter & ~7LL) != 0);
	add(l, "\tsk_mutex.wait_lock.locked=%u", m->wait_lock.locked);
	add_list(l, "sk_mutex.wait_list", &m->wait_list);
	add(l, "\tsk_hash_lock.locked=%u\tsk_hash_lock.held=%d", sk->sk_hash_lock.locked,
	    sk->sk_hash_lock.locked != 0);
}

static void add_fields(struct line *l, const void *obj)
{
	const struct sock *sk = obj;
	const struct sock_common *c = &sk->__sk_common;

	add(l, "\t__sk_common.skc_addrpair=%llu", c->skc_addrpair);
	add(l, "\t__sk_common.skc_daddr=%u", c->skc_daddr);
	add(l, "\t__sk_common.skc_rcv_saddr=%u", c->skc_rcv_saddr);
	add(l, "\t__sk_common.skc_hash=%u", c->skc_hash);
	add(l, "\t__sk_common.skc_dport=%u", c->skc_dport);
	add(l, "\t__sk_common.skc_num=%u", c->skc_num);
	add(l, "\t__sk_common.skc_family=%u", c->skc_family);
	add(l, "\t__sk_common.skc_reuse=%u", c->skc_reuse);
	add(l, "\t__sk_common.skc_reuseport=%u", c->skc_reuseport);
	add(l, "\t__sk_common.skc_ipv6only=%u", c->skc_ipv6only);
	add(l, "\t__sk_common.skc_net_refcnt=%u", c->skc_net_refcnt);
	add(l, "\t__sk_common.skc_bound_dev_if=%d", c->skc_bound_dev_if);
	add(l, "\t__sk_common.skc_state=%u", (unsigned int)c->skc_state);
	add(l, "\t__sk_common.skc_refcnt.refs.counter=%d", c->skc_refcnt.refs.counter);
	add(l, "\t__sk_common.skc_refcnt=%d", c->skc_refcnt.refs.counter);
	add(l, "\tsk_lock.slock.locked=%u", sk->sk_lock.slock.locked);
	add(l, "\tsk_lock.slock.held=%d", sk->sk_lock.slock.locked != 0);
	add(l, "\tsk_lock.slock.owner=%u", sk->sk_lock.slock.owner);
	add(l, "\tsk_lock.owned=%d", sk->sk_lock.owned);
	add(l, "\tsk_rcvbuf=%d", sk->sk_rcvbuf);
	add(l, "\tsk_sndbuf=%d", sk->sk_sndbuf);
	add(l, "\tsk_forward_alloc=%d", sk->sk_forward_alloc);
	add(l, "\tsk_wmem_queued=%u", sk->sk_wmem_queued);
	add(l, "\tsk_padding=%u", sk->sk_padding);
	add(l, "\tsk_kern_sock=%u", sk->sk_kern_sock);
	add(l, "\tsk_no_check_tx=%u", sk->sk_no_check_tx);
	add(l, "\tsk_no_check_rx=%u", sk->sk_no_check_rx);
	add(l, "\tsk_userlocks=%u", sk->sk_userlocks);
	add(l, "\tsk_pacing_delta=%d", sk->sk_pacing_delta);
	add(l, "\tsk_protocol=%u", sk->sk_protocol);
	add(l, "\tsk_type=%u", sk->sk_type);
	add(l, "\tsk_flags=%lu", sk->sk_flags);
	add(l, "\tsk_rcvtimeo=%ld", sk->sk_rcvtimeo);
	add(l, "\tsk_sndtimeo=%ld", sk->sk_sndtimeo);
	add(l, "\tsk_u.sk_mark=%u", sk->sk_u.sk_mark);
	add(l, "\tsk_u.halves.lo=%u", sk->sk_u.halves.lo);
	add(l, "\tsk_u.halves.hi=%u", sk->sk_u.halves.hi);
	add(l, "\tsk_shutdown=%u", sk->sk_shutdown);
	add(l, "\tsk_err=%d", sk->sk_err);
	add(l, "\tsk_dead=%d", sk->sk_dead);
	add(l, "\tsk_name=%.*s", (int)strnlen(sk->sk_name, sizeof(sk->sk_name)), sk->sk_name);
	add(l, "\tsk_stats.rx_bytes=%llu", sk->sk_stats.rx_bytes);
	add(l, "\tsk_stats.tx_bytes=%llu", sk->sk_stats.tx_bytes);
	add(l, "\tsk_stats.rx_packets=%u", sk->sk_stats.rx_packets);
	add(l, "\tsk_stats.tx_packets=%u", sk->sk_stats.tx_packets);
	add(l, "\tsk_stats.drops=%u", sk->sk_stats.drops);
	add(l, "\tsk_socket=%#lx", (unsigned long)sk->sk_socket);
	add(l, "\tsk_state_change=%#lx", (unsigned long)sk->sk_state_change);
	add(l, "\tsk_next=%#lx", (unsigned long)sk->sk_next);
	add_complex_fields(l, sk);
}

static const char *base_name(const char *path)
{
	const char *slash = strrchr(path, '/');

	return slash ? slash + 1 : path;
}

static void log_objects(const char *fn, const char *file, const char *phase, int depth,
			int nobj, const void *o0, const void *o1, int has_ret, long ret)
{
	const void *objs[2] = { o0, o1 };
	int i;

	for (i = 0; i < nobj; i++) {
		struct line l = { .len = 0 };

		add(&l, "fn=%s\tfile=%s\tphase=%s\ttid=%d\tdepth=%d\tslot=%d\tobj=%#lx",
		    fn, base_name(file), phase, gettid(), depth, i, (unsigned long)objs[i]);
		if (has_ret)
			add(&l, "\tret=%ld", ret);
		else
			add(&l, "\tret=-");
		if (objs[i])
			add_fields(&l, objs[i]);
		add(&l, "\n");
		if (write(gt_fd, l.text, l.len) != (ssize_t)l.len)
			abort();
	}
}

void gt_entry(const char *fn, const char *file, int nobj, const void *o0, const void *o1)
{
	log_objects(fn, file, "entry", gt_depth++, nobj, o0, o1, 0, 0);
}

void gt_exit(const char *fn, const char *file, int nobj, const void *o0, const void *o1,
	     int has_ret, long ret)
{
	log_objects(fn, file, "exit", --gt_depth, nobj, o0, o1, has_ret, ret);
}
