/* Core socket object: allocation from a free list, references, locking, memory
 * accounting, hashing.  Freed sockets go back on a LIFO free list, so the next
 * allocation reuses the address of the last freed socket.  The free list and the hash
 * table are per thread (like the kernel's per-CPU slab caches): a socket is only ever
 * touched by the thread that allocated it, so what a method logs just before it
 * returns is still what a probe reads right after, even for a socket just freed. */
#define _GNU_SOURCE
#include <pthread.h>
#include <string.h>
#include <unistd.h>

#include "sock.h"

#define POOL_SIZE 64
#define HASH_SIZE 16

static struct tcp_sock sock_pool[POOL_SIZE];
static __thread struct sock *free_list;
static int pool_used;
static pthread_mutex_t pool_mutex = PTHREAD_MUTEX_INITIALIZER;

static __thread struct sock *hash_table[HASH_SIZE];
static __thread struct hlist_node *bind_chain;

/* Same name as a static function in tcp.c: two distinct functions to probe. */
static METHOD int sk_check(const struct sock *sk)
{
	int ret;

	GT_ENTRY(sk);
	ret = sk->__sk_common.skc_refcnt.refs.counter > 0 ? 0 : -EINVAL;
	GT_EXIT_RET(sk, ret);
	return ret;
}

/* Reached only through sk->sk_state_change. */
static METHOD void sock_def_wakeup(struct sock *sk)
{
	GT_ENTRY(sk);
	sk->sk_flags |= SOCK_DONE_FLAG;
	sk->sk_u.halves.hi++;
	GT_EXIT(sk);
}

METHOD struct sock *sk_alloc(int family, const char *name)
{
	struct sock *sk = NULL;

	GT_ENTRY(NULL);
	if (free_list) {
		sk = free_list;
		free_list = sk->sk_next;
	} else {
		pthread_mutex_lock(&pool_mutex);
		if (pool_used < POOL_SIZE)
			sk = &sock_pool[pool_used++].inet.sk;
		pthread_mutex_unlock(&pool_mutex);
	}
	if (sk) {
		memset(sk, 0, sizeof(struct tcp_sock));
		sk->__sk_common.skc_family = family;
		sk->__sk_common.skc_state = TCP_CLOSE;
		sk->__sk_common.skc_refcnt.refs.counter = 1;
		sk->__sk_common.skc_net_refcnt = 1;
		sk->sk_rcvbuf = 4096;
		sk->sk_sndbuf = 4096;
		sk->sk_rcvtimeo = 1000;
		sk->sk_sndtimeo = 1000;
		sk->sk_pacing_delta = -3;
		sk->sk_state_change = sock_def_wakeup;
		strncpy(sk->sk_name, name, sizeof(sk->sk_name) - 1);
		sk->sk_receive_queue.next = (struct sk_buff *)&sk->sk_receive_queue;
		sk->sk_receive_queue.prev = (struct sk_buff *)&sk->sk_receive_queue;
		sk->sk_accept_waiters.next = &sk->sk_accept_waiters;
		sk->sk_accept_waiters.prev = &sk->sk_accept_waiters;
		sk->sk_mutex.wait_list.next = &sk->sk_mutex.wait_list;
		sk->sk_mutex.wait_list.prev = &sk->sk_mutex.wait_list;
	}
	GT_EXIT_RET(sk, sk);
	return sk;
}

METHOD void sk_free(struct sock *sk)
{
	GT_ENTRY(sk);
	sk->sk_dead = true;
	sk->sk_socket = NULL;
	sk->sk_next = free_list;
	free_list = sk;
	GT_EXIT(sk);
}

METHOD void sock_hold(struct sock *sk)
{
	GT_ENTRY(sk);
	__atomic_add_fetch(&sk->__sk_common.skc_refcnt.refs.counter, 1, __ATOMIC_SEQ_CST);
	GT_EXIT(sk);
}

METHOD void sock_put(struct sock *sk)
{
	GT_ENTRY(sk);
	if (__atomic_sub_fetch(&sk->__sk_common.skc_refcnt.refs.counter, 1,
			       __ATOMIC_SEQ_CST) == 0)
		sk_free(sk);
	GT_EXIT(sk);
}

METHOD void lock_sock(struct sock *sk)
{
	GT_ENTRY(sk);
	while (__atomic_exchange_n(&sk->sk_lock.slock.locked, 1, __ATOMIC_ACQUIRE))
		;
	sk->sk_lock.slock.owner = 1;
	sk->sk_lock.owned = 1;
	/* the owner: a thread id above the three flag bits, one flag set */
	__atomic_store_n(&sk->sk_mutex.owner.counter, ((long long)gettid() << 3) | 1,
			 __ATOMIC_RELEASE);
	GT_EXIT(sk);
}

METHOD void release_sock(struct sock *sk)
{
	GT_ENTRY(sk);
	__atomic_store_n(&sk->sk_mutex.owner.counter, 0, __ATOMIC_RELEASE);
	sk->sk_lock.owned = 0;
	sk->sk_lock.slock.owner = 0;
	__atomic_store_n(&sk->sk_lock.slock.locked, 0, __ATOMIC_RELEASE);
	GT_EXIT(sk);
}

METHOD void sk_mem_charge(struct sock *sk, int size)
{
	GT_ENTRY(sk);
	sk->sk_forward_alloc -= size;
	sk->sk_wmem_queued += size;
	__atomic_add_fetch(&sk->sk_mem_pages.counter, (size + 4095) / 4096, __ATOMIC_SEQ_CST);
	GT_EXIT(sk);
}

METHOD void sk_mem_uncharge(struct sock *sk, int size)
{
	GT_ENTRY(sk);
	sk->sk_forward_alloc += size;
	sk->sk_wmem_queued -= size;
	__atomic_sub_fetch(&sk->sk_mem_pages.counter, (size + 4095) / 4096, __ATOMIC_SEQ_CST);
	GT_EXIT(sk);
}

/* Two objects of the traced type in one call. */
METHOD int sk_clone_state(struct sock *dst, const struct sock *src)
{
	int ret;

	GT_ENTRY2(dst, src);
	ret = sk_check(src);
	if (ret == 0) {
		dst->__sk_common.skc_rcv_saddr = src->__sk_common.skc_rcv_saddr;
		dst->__sk_common.skc_num = src->__sk_common.skc_num;
		dst->__sk_common.skc_reuse = src->__sk_common.skc_reuse;
		dst->sk_rcvbuf = src->sk_rcvbuf;
		dst->sk_sndbuf = src->sk_sndbuf;
		dst->sk_userlocks = src->sk_userlocks;
		dst->sk_u.sk_mark = src->sk_u.sk_mark;
	}
	GT_EXIT2_RET(dst, src, ret);
	return ret;
}

METHOD void sk_hash_add(struct sock *sk)
{
	unsigned int slot;

	GT_ENTRY(sk);
	slot = sk->__sk_common.skc_num % HASH_SIZE;
	sk->__sk_common.skc_hash = slot;
	sk->sk_next = hash_table[slot];
	hash_table[slot] = sk;
	/* the hash lock stays held until sk_unhash */
	__atomic_store_n(&sk->sk_hash_lock.locked, 1, __ATOMIC_SEQ_CST);
	sk->sk_bind_node.next = bind_chain;
	if (bind_chain)
		bind_chain->pprev = &sk->sk_bind_node.next;
	bind_chain = &sk->sk_bind_node;
	sk->sk_bind_node.pprev = &bind_chain;
	GT_EXIT(sk);
}

/* Reaches the object through a struct sock **: *pprev is the socket to unlink. */
static METHOD void sk_hash_unlink(struct sock **pprev)
{
	struct sock *sk = *pprev;

	GT_ENTRY(sk);
	*pprev = sk->sk_next;
	sk->sk_next = NULL;
	sk->__sk_common.skc_hash = 0;
	if (sk->sk_bind_node.pprev) {
		*sk->sk_bind_node.pprev = sk->sk_bind_node.next;
		if (sk->sk_bind_node.next)
			sk->sk_bind_node.next->pprev = sk->sk_bind_node.pprev;
		sk->sk_bind_node.next = NULL;
		sk->sk_bind_node.pprev = NULL;
	}
	__atomic_store_n(&sk->sk_hash_lock.locked, 0, __ATOMIC_RELEASE);
	GT_EXIT(sk);
}

METHOD void sk_unhash(struct sock *sk)
{
	struct sock **pprev;

	GT_ENTRY(sk);
	for (pprev = &hash_table[sk->__sk_common.skc_hash % HASH_SIZE]; *pprev;
	     pprev = &(*pprev)->sk_next) {
		if (*pprev == sk) {
			sk_hash_unlink(pprev);
			break;
		}
	}
	GT_EXIT(sk);
}

/* A holder and the object itself; sock->sk is still NULL at entry. */
METHOD void sock_init_data(struct socket *sock, struct sock *sk)
{
	GT_ENTRY2(sock->sk, sk);
	sock->sk = sk;
	sk->sk_socket = sock;
	sk->sk_type = sock->type;
	sk->__sk_common.skc_state = TCP_CLOSE;
	sk->sk_err = 0;
	(void)sk_check(sk);
	GT_EXIT2(sock->sk, sk);
}
