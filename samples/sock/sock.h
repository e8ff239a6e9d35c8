/*
 * A user-space miniature of the Linux socket layer, for ctracer to trace.
 *
 * The shapes ctracer must understand are all here: struct sock_common embedded first
 * in struct sock; struct inet_sock embedding struct sock first and struct tcp_sock
 * embedding inet_sock (aliases, recursively); struct socket holding a struct sock
 * pointer (a pointer holder); bitfields (signed and unsigned), an enum state, unions
 * (named and anonymous), a char array, a nested stats struct, typedef chains and
 * volatile members, and members of the kernel's complex types, named as the kernel
 * names them so that ctracer's collectors recognise them (spinlock_t, raw_spinlock_t,
 * socket_lock_t, struct mutex, refcount_t, atomic_t, atomic64_t, atomic_long_t,
 * struct sk_buff_head, struct list_head, struct hlist_node, ktime_t).
 *
 * Every function that takes or returns a struct sock (directly, const, through an
 * alias, a holder or a struct sock **) is a "method".  Each method logs a ground-truth
 * line at entry and just before it returns (see gtlog.c) when CTRACER_SAMPLE_LOG is set.
 */
#ifndef SAMPLE_SOCK_H
#define SAMPLE_SOCK_H

#include <stdbool.h>
#include <stddef.h>

typedef unsigned char __u8;
typedef unsigned short __u16;
typedef unsigned int __u32;
typedef unsigned long long __u64;
typedef __u16 __be16;
typedef __u32 __be32;

/* Methods stay out of line and unchanged by inter-procedural optimisation, so the
 * -O2 build keeps one probe-able copy of each with the standard calling convention. */
#ifdef __OPTIMIZE__
#define METHOD __attribute__((noipa, used))
#else
#define METHOD __attribute__((noinline, used))
#endif

typedef struct {
	int counter;
} atomic_t;

typedef struct {
	atomic_t refs;
} refcount_t;

typedef struct {
	long long counter;
} atomic64_t;

typedef atomic64_t atomic_long_t;

typedef long long ktime_t;

typedef struct {
	volatile unsigned int locked;
	unsigned int owner;
} spinlock_t;

typedef struct {
	volatile unsigned char locked;
} raw_spinlock_t;

struct list_head {
	struct list_head *next, *prev;
};

struct hlist_node {
	struct hlist_node *next, **pprev;
};

struct sk_buff;

struct sk_buff_head {
	struct sk_buff *next;
	struct sk_buff *prev;
	__u32 qlen;
	spinlock_t lock;
};

/* The owner word holds the owning thread with three flag bits below it. */
struct mutex {
	atomic_long_t owner;
	raw_spinlock_t wait_lock;
	struct list_head wait_list;
};

typedef struct {
	spinlock_t slock;
	int owned;
} socket_lock_t;

enum sk_tcp_state {
	TCP_ESTABLISHED = 1,
	TCP_SYN_SENT,
	TCP_SYN_RECV,
	TCP_FIN_WAIT1,
	TCP_FIN_WAIT2,
	TCP_TIME_WAIT,
	TCP_CLOSE,
	TCP_CLOSE_WAIT,
	TCP_LAST_ACK,
	TCP_LISTEN,
	TCP_CLOSING,
};

enum socket_state {
	SS_FREE = 0,
	SS_UNCONNECTED,
	SS_CONNECTING,
	SS_CONNECTED,
	SS_DISCONNECTING,
};

struct sock_common {
	union {
		__u64 skc_addrpair;
		struct {
			__be32 skc_daddr;
			__be32 skc_rcv_saddr;
		};
	};
	unsigned int skc_hash;
	__be16 skc_dport;
	__u16 skc_num;
	unsigned short skc_family;
	volatile unsigned char skc_reuse:4;
	unsigned char skc_reuseport:1;
	unsigned char skc_ipv6only:1;
	unsigned char skc_net_refcnt:1;
	int skc_bound_dev_if;
	enum sk_tcp_state skc_state;
	refcount_t skc_refcnt;
};

struct sock_stats {
	__u64 rx_bytes;
	__u64 tx_bytes;
	__u32 rx_packets;
	__u32 tx_packets;
	__u32 drops;
};

union sk_mark_u {
	__u32 sk_mark;
	struct {
		__u16 lo;
		__u16 hi;
	} halves;
};

struct socket;

struct sock {
	struct sock_common __sk_common;
	socket_lock_t sk_lock;
	int sk_rcvbuf;
	int sk_sndbuf;
	int sk_forward_alloc;
	unsigned int sk_wmem_queued;
	unsigned int sk_padding:1,
		     sk_kern_sock:1,
		     sk_no_check_tx:1,
		     sk_no_check_rx:1,
		     sk_userlocks:4;
	int sk_pacing_delta:5;
	__u8 sk_protocol;
	__u16 sk_type;
	unsigned long sk_flags;
	long sk_rcvtimeo;
	long sk_sndtimeo;
	union sk_mark_u sk_u;
	unsigned char sk_shutdown;
	signed char sk_err;
	bool sk_dead;
	char sk_name[16];
	struct sock_stats sk_stats;
	int sk_backlog[4];
	struct socket *sk_socket;
	void (*sk_state_change)(struct sock *sk);
	struct sock *sk_next;
	atomic_t sk_drops;
	atomic64_t sk_bytes_sent;
	atomic_long_t sk_mem_pages;
	ktime_t sk_stamp;
	struct sk_buff_head sk_receive_queue;
	struct list_head sk_accept_waiters;
	struct hlist_node sk_bind_node;
	struct mutex sk_mutex;
	raw_spinlock_t sk_hash_lock;
};

struct inet_sock {
	struct sock sk;
	__be32 inet_saddr;
	__u16 inet_sport;
	__u8 tos;
	__u8 min_ttl;
	__u8 recverr:1,
	     is_icsk:1,
	     freebind:1;
	int uc_ttl;
};

struct tcp_sock {
	struct inet_sock inet;
	__u32 snd_nxt;
	__u32 rcv_nxt;
	struct list_head accept_waiter;   /* on sk_accept_waiters while listening */
};

struct socket {
	enum socket_state state;
	short type;
	unsigned long flags;
	struct sock *sk;
	const void *ops;
};

#define SOCK_STREAM 1
#define AF_INET 2
#define IPPROTO_TCP 6
#define SHUTDOWN_MASK 3
#define SOCK_DONE_FLAG 0x4UL

#define ENOMEM 12
#define EINVAL 22
#define EAGAIN 11
#define ENOTCONN 107

/* sock.c */
struct sock *sk_alloc(int family, const char *name);
void sk_free(struct sock *sk);
void sock_hold(struct sock *sk);
void sock_put(struct sock *sk);
void lock_sock(struct sock *sk);
void release_sock(struct sock *sk);
void sk_mem_charge(struct sock *sk, int size);
void sk_mem_uncharge(struct sock *sk, int size);
int sk_clone_state(struct sock *dst, const struct sock *src);
void sk_hash_add(struct sock *sk);
void sk_unhash(struct sock *sk);
void sock_init_data(struct socket *sock, struct sock *sk);

/* inet.c */
int inet_create(struct socket *sock, int protocol);
int inet_bind(struct socket *sock, __u16 port);
int inet_connect(struct socket *sock, __be32 daddr, __be16 dport);
int inet_listen(struct socket *sock, int backlog);
int inet_accept(struct socket *sock, struct socket *newsock);
int inet_release(struct socket *sock);
void inet_sk_set_tos(struct inet_sock *inet, __u8 tos);
__u16 inet_sk_port(const struct inet_sock *inet);

/* tcp.c */
void tcp_set_state(struct sock *sk, int state);
long tcp_sendmsg(struct sock *sk, const void *buf, long len);
long tcp_recvmsg(struct sock *sk, void *buf, long len);
void tcp_close(struct sock *sk, long timeout);
struct sock *tcp_accept(struct sock *listener, int *err);
void tcp_rcv_nxt_update(struct tcp_sock *tp, __u32 seq);

/* main.c: CLOCK_MONOTONIC in nanoseconds (what a ktime_t holds) */
long long sample_now_ns(void);

/* gtlog.c: ground truth, written only when CTRACER_SAMPLE_LOG names a file.  The
 * logger takes objects as const void * so that it is not itself a method. */
extern int gt_fd;
void gt_open(void);
void gt_entry(const char *fn, const char *file, int nobj, const void *o0, const void *o1);
void gt_exit(const char *fn, const char *file, int nobj, const void *o0, const void *o1,
	     int has_ret, long ret);

#define GT_ENTRY(o) \
	do { if (gt_fd >= 0) gt_entry(__func__, __FILE__, 1, (o), NULL); } while (0)
#define GT_ENTRY2(a, b) \
	do { if (gt_fd >= 0) gt_entry(__func__, __FILE__, 2, (a), (b)); } while (0)
#define GT_EXIT(o) \
	do { if (gt_fd >= 0) gt_exit(__func__, __FILE__, 1, (o), NULL, 0, 0); } while (0)
#define GT_EXIT2(a, b) \
	do { if (gt_fd >= 0) gt_exit(__func__, __FILE__, 2, (a), (b), 0, 0); } while (0)
#define GT_EXIT_RET(o, r) \
	do { if (gt_fd >= 0) gt_exit(__func__, __FILE__, 1, (o), NULL, 1, (long)(r)); } while (0)
#define GT_EXIT2_RET(a, b, r) \
	do { if (gt_fd >= 0) gt_exit(__func__, __FILE__, 2, (a), (b), 1, (long)(r)); } while (0)

#endif
