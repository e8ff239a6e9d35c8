/* TCP: state changes, send/receive with memory accounting, close and accept. */
#include <stddef.h>

#include "sock.h"

/* Same name as a static function in sock.c: two distinct functions to probe. */
static METHOD int sk_check(const struct sock *sk)
{
	int ret;

	GT_ENTRY(sk);
	ret = sk->__sk_common.skc_state == TCP_ESTABLISHED ? 0 : -ENOTCONN;
	GT_EXIT_RET(sk, ret);
	return ret;
}

static METHOD int sk_stream_memory_free(const struct sock *sk)
{
	int ret;

	GT_ENTRY(sk);
	ret = sk->sk_wmem_queued < (unsigned int)sk->sk_sndbuf;
	GT_EXIT_RET(sk, ret);
	return ret;
}

METHOD void tcp_set_state(struct sock *sk, int state)
{
	GT_ENTRY(sk);
	sk->__sk_common.skc_state = state;
	if (state == TCP_ESTABLISHED || state == TCP_CLOSE)
		sk->sk_state_change(sk);
	GT_EXIT(sk);
}

METHOD void tcp_rcv_nxt_update(struct tcp_sock *tp, __u32 seq)
{
	GT_ENTRY(tp);
	tp->rcv_nxt = seq;
	tp->inet.sk.sk_stats.drops += seq & 1;
	GT_EXIT(tp);
}

METHOD long tcp_sendmsg(struct sock *sk, const void *buf, long len)
{
	long ret;

	GT_ENTRY(sk);
	(void)buf;
	if (sk_check(sk)) {
		ret = -ENOTCONN;
	} else if (!sk_stream_memory_free(sk)) {
		sk->sk_err = -EAGAIN;
		sk->sk_stats.drops++;
		__atomic_add_fetch(&sk->sk_drops.counter, 1, __ATOMIC_SEQ_CST);
		ret = -EAGAIN;
	} else {
		sk_mem_charge(sk, (int)len);
		sk->sk_stats.tx_bytes += len;
		sk->sk_stats.tx_packets++;
		__atomic_add_fetch(&sk->sk_bytes_sent.counter, len, __ATOMIC_SEQ_CST);
		sk->sk_stamp = sample_now_ns();
		sk->sk_pacing_delta = (sk->sk_pacing_delta + 7) % 16 - 8;
		ret = len;
	}
	GT_EXIT_RET(sk, ret);
	return ret;
}

METHOD long tcp_recvmsg(struct sock *sk, void *buf, long len)
{
	long ret;

	GT_ENTRY(sk);
	(void)buf;
	if (sk->sk_wmem_queued < len)
		len = sk->sk_wmem_queued;
	if (len > 0) {
		sk_mem_uncharge(sk, (int)len);
		sk->sk_stats.rx_bytes += len;
		sk->sk_stats.rx_packets++;
		sk->sk_receive_queue.qlen++;
	}
	ret = len;
	GT_EXIT_RET(sk, ret);
	return ret;
}

METHOD void tcp_close(struct sock *sk, long timeout)
{
	GT_ENTRY(sk);
	lock_sock(sk);
	sk->sk_rcvtimeo = timeout;
	tcp_set_state(sk, TCP_FIN_WAIT1);
	tcp_set_state(sk, TCP_CLOSE);
	if (sk->sk_accept_waiters.next != &sk->sk_accept_waiters) {
		struct list_head *w = sk->sk_accept_waiters.next;

		w->prev->next = w->next;
		w->next->prev = w->prev;
		w->next = w->prev = w;
	}
	sk->sk_receive_queue.qlen = 0;
	if (sk->__sk_common.skc_num)
		sk_unhash(sk);
	release_sock(sk);
	sock_put(sk);
	GT_EXIT(sk);
}

/* Inlined in the -O2 build: a method with no out-of-line copy there. */
static inline int sk_is_listener(const struct sock *sk)
{
	int ret;

	GT_ENTRY(sk);
	ret = sk->__sk_common.skc_state == TCP_LISTEN;
	GT_EXIT_RET(sk, ret);
	return ret;
}

/* Takes the listener and returns a new socket: two objects, one only at exit. */
METHOD struct sock *tcp_accept(struct sock *listener, int *err)
{
	struct sock *newsk;

	GT_ENTRY2(listener, NULL);
	newsk = NULL;
	if (sk_is_listener(listener))
		newsk = sk_alloc(listener->__sk_common.skc_family, "accepted");
	if (!newsk) {
		*err = -ENOMEM;
	} else {
		tcp_set_state(newsk, TCP_ESTABLISHED);
		if (sk_clone_state(newsk, listener) == 0)
			listener->sk_backlog[1]++;
		*err = 0;
	}
	GT_EXIT2_RET(listener, newsk, newsk);
	return newsk;
}
