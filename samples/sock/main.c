/*
 * sockdemo: runs socket lifecycles through the miniature socket layer.
 *
 *   sockdemo [--loops N] [--threads T] [--delay-ms M] [--wait-signal]
 *
 * Each thread runs N lifecycles (create, bind, connect or listen+accept, send/recv,
 * hold/put, release), sleeping M ms after each.  Sockets come from a LIFO free list,
 * so later sockets reuse earlier ones' addresses.  --wait-signal prints "ready PID"
 * and waits for SIGUSR1 before starting, so a tracer can attach to a running process.
 * CTRACER_SAMPLE_LOG=FILE writes the ground-truth log (see gtlog.c).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "sock.h"

struct options {
	int loops;
	int threads;
	int delay_ms;
	int wait_signal;
};

static struct options opts = { .loops = 6, .threads = 1, .delay_ms = 0 };

long long sample_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void sleep_ms(int ms)
{
	struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };

	while (ms > 0 && nanosleep(&ts, &ts) != 0)
		;
}

/* Takes a struct socket: a (holder) method too, so it logs like the others. */
static METHOD void client_lifecycle(struct socket *sock, int i)
{
	char buf[512];
	int k;

	GT_ENTRY(sock->sk);
	memset(buf, 'x', sizeof(buf));
	inet_bind(sock, (__u16)(40000 + i));
	inet_connect(sock, 0x0a000001 + i, 80);
	inet_sk_set_tos((struct inet_sock *)sock->sk, (__u8)(0x10 + i));
	(void)inet_sk_port((struct inet_sock *)sock->sk);
	for (k = 0; k < 5; k++) {
		tcp_sendmsg(sock->sk, buf, 700 * (k + 1));
		tcp_recvmsg(sock->sk, buf, 300 * k);
	}
	sock_hold(sock->sk);
	sock_put(sock->sk);
	GT_EXIT(sock->sk);
}

static METHOD void server_lifecycle(struct socket *sock, int i)
{
	struct socket child = { .type = SOCK_STREAM };
	char buf[256];

	GT_ENTRY(sock->sk);
	memset(buf, 'y', sizeof(buf));
	inet_bind(sock, (__u16)(8000 + i));
	inet_listen(sock, 8 + i);
	if (inet_accept(sock, &child) == 0) {
		tcp_sendmsg(child.sk, buf, 128);
		tcp_recvmsg(child.sk, buf, 64);
		inet_release(&child);
	}
	GT_EXIT(sock->sk);
}

static void lifecycle(int thread, int i)
{
	struct socket sock = { .type = SOCK_STREAM };
	int n = thread * 1000 + i;

	if (inet_create(&sock, IPPROTO_TCP) != 0)
		return;
	if (i % 3 == 2)
		server_lifecycle(&sock, n);
	else
		client_lifecycle(&sock, n);
	inet_release(&sock);
}

static void *worker(void *arg)
{
	int thread = (int)(long)arg;
	int i;

	for (i = 0; i < opts.loops; i++) {
		lifecycle(thread, i);
		sleep_ms(opts.delay_ms);
	}
	return NULL;
}

static void usage(const char *prog)
{
	fprintf(stderr, "usage: %s [--loops N] [--threads T] [--delay-ms M] [--wait-signal]\n",
		prog);
	exit(2);
}

static int int_arg(int argc, char **argv, int *i)
{
	char *end;
	long v;

	if (*i + 1 >= argc)
		usage(argv[0]);
	v = strtol(argv[++*i], &end, 10);
	if (*end || v < 0 || v > 1000000)
		usage(argv[0]);
	return (int)v;
}

int main(int argc, char **argv)
{
	pthread_t tids[64];
	int i;

	for (i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--loops"))
			opts.loops = int_arg(argc, argv, &i);
		else if (!strcmp(argv[i], "--threads"))
			opts.threads = int_arg(argc, argv, &i);
		else if (!strcmp(argv[i], "--delay-ms"))
			opts.delay_ms = int_arg(argc, argv, &i);
		else if (!strcmp(argv[i], "--wait-signal"))
			opts.wait_signal = 1;
		else
			usage(argv[0]);
	}
	if (opts.threads < 1 || opts.threads > 64)
		usage(argv[0]);
	gt_open();

	if (opts.wait_signal) {
		sigset_t set;
		int sig;

		sigemptyset(&set);
		sigaddset(&set, SIGUSR1);
		sigprocmask(SIG_BLOCK, &set, NULL);
		printf("ready %d\n", getpid());
		fflush(stdout);
		sigwait(&set, &sig);
	}

	if (opts.threads == 1) {
		worker((void *)0L);
	} else {
		for (i = 0; i < opts.threads; i++)
			pthread_create(&tids[i], NULL, worker, (void *)(long)i);
		for (i = 0; i < opts.threads; i++)
			pthread_join(tids[i], NULL);
	}
	printf("sockdemo: %d thread(s) x %d lifecycles done\n", opts.threads, opts.loops);
	return 0;
}
