/* The socket layer: struct socket operations that reach the struct sock through
 * sock->sk (a pointer holder), and inet_sock methods (an alias of struct sock). */
#include <stddef.h>

#include "sock.h"

/* The object a holder method's exit refers to: the one seen at entry, or, when the
 * holder had none then, the one it holds now (created inside the call). */
#define HELD_AT_EXIT(at_entry, holder) ((at_entry) ? (at_entry) : (holder)->sk)

/* Takes a struct sock_common, not a struct sock: not a method of struct sock. */
static __attribute__((noinline)) void skc_set_addrs(struct sock_common *skc, __be32 daddr,
						    __be32 saddr)
{
	skc->skc_daddr = daddr;
	skc->skc_rcv_saddr = saddr;
}

METHOD __u16 inet_sk_port(const struct inet_sock *inet)
{
	__u16 port;

	GT_ENTRY(inet);
	port = inet->inet_sport ? inet->inet_sport : inet->sk.__sk_common.skc_num;
	GT_EXIT_RET(inet, port);
	return port;
}

METHOD void inet_sk_set_tos(struct inet_sock *inet, __u8 tos)
{
	GT_ENTRY(inet);
	inet->tos = tos;
	inet->sk.sk_u.halves.lo = tos;
	inet->sk.sk_userlocks = tos & 0xf;
	GT_EXIT(inet);
}

METHOD int inet_create(struct socket *sock, int protocol)
{
	struct sock *at_entry = sock->sk;
	struct sock *sk;
	int ret = 0;

	GT_ENTRY(at_entry);
	sk = sk_alloc(AF_INET, sock->type == SOCK_STREAM ? "tcp" : "raw");
	if (!sk) {
		ret = -ENOMEM;
	} else {
		sock_init_data(sock, sk);
		sk->sk_protocol = protocol;
		sock->state = SS_UNCONNECTED;
	}
	GT_EXIT_RET(HELD_AT_EXIT(at_entry, sock), ret);
	return ret;
}

METHOD int inet_bind(struct socket *sock, __u16 port)
{
	struct sock *sk = sock->sk;
	struct inet_sock *inet = (struct inet_sock *)sk;
	int ret;

	GT_ENTRY(sk);
	lock_sock(sk);
	ret = sk->__sk_common.skc_num ? -EINVAL : 0;
	if (ret == 0) {
		sk->__sk_common.skc_num = port;
		sk->__sk_common.skc_reuse = port & 0xf;
		sk->__sk_common.skc_reuseport = port & 1;
		inet->inet_sport = port;
		skc_set_addrs(&sk->__sk_common, 0, 0x0100007f);
		sk_hash_add(sk);
	}
	release_sock(sk);
	GT_EXIT_RET(sk, ret);
	return ret;
}

METHOD int inet_connect(struct socket *sock, __be32 daddr, __be16 dport)
{
	struct sock *sk = sock->sk;
	int ret = 0;

	GT_ENTRY(sk);
	lock_sock(sk);
	sock->state = SS_CONNECTING;
	tcp_set_state(sk, TCP_SYN_SENT);
	skc_set_addrs(&sk->__sk_common, daddr, sk->__sk_common.skc_rcv_saddr);
	sk->__sk_common.skc_dport = dport;
	sk->__sk_common.skc_bound_dev_if = 2;
	tcp_rcv_nxt_update((struct tcp_sock *)sk, daddr ^ 0x5a5a);
	tcp_set_state(sk, TCP_ESTABLISHED);
	sock->state = SS_CONNECTED;
	release_sock(sk);
	GT_EXIT_RET(sk, ret);
	return ret;
}

METHOD int inet_listen(struct socket *sock, int backlog)
{
	struct sock *sk = sock->sk;

	GT_ENTRY(sk);
	lock_sock(sk);
	sk->sk_backlog[0] = backlog;
	tcp_set_state(sk, TCP_LISTEN);
	{	/* the listener's own waiter entry: the list is not empty while listening */
		struct list_head *w = &((struct tcp_sock *)sk)->accept_waiter;

		w->next = &sk->sk_accept_waiters;
		w->prev = &sk->sk_accept_waiters;
		sk->sk_accept_waiters.next = w;
		sk->sk_accept_waiters.prev = w;
	}
	release_sock(sk);
	GT_EXIT_RET(sk, 0);
	return 0;
}

/* Two holders; newsock->sk is NULL at entry and set inside. */
METHOD int inet_accept(struct socket *sock, struct socket *newsock)
{
	struct sock *sk = sock->sk;
	struct sock *new_at_entry = newsock->sk;
	struct sock *newsk;
	int err = 0;

	GT_ENTRY2(sk, new_at_entry);
	lock_sock(sk);
	newsk = tcp_accept(sk, &err);
	release_sock(sk);
	if (newsk) {
		sock_init_data(newsock, newsk);
		newsock->state = SS_CONNECTED;
		sk->sk_stats.rx_packets++;
	}
	GT_EXIT2_RET(sk, HELD_AT_EXIT(new_at_entry, newsock), err);
	return err;
}

METHOD int inet_release(struct socket *sock)
{
	struct sock *sk = sock->sk;

	GT_ENTRY(sk);
	if (sk) {
		sock->sk = NULL;
		sock->state = SS_FREE;
		sk->sk_shutdown = SHUTDOWN_MASK;
		tcp_close(sk, 0);
	}
	GT_EXIT_RET(sk, 0);
	return 0;
}
