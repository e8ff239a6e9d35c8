/*
 * watchdemo: a struct field written from known source lines, for `ctracer trace --watch`.
 *
 *   watchdemo [--accounts N] [--ops N] [--settle-ms M]
 *
 * Each account is allocated, opened (account_open: the first call that shows it to a
 * tracer), left alone for M ms (time for a tracer to arm its breakpoints), worked on
 * (account_work: deposits and fees through inlined helpers, an explicit store, and a
 * store of the value it already holds), closed and freed, and M ms pass again (time
 * for the tracer to see the end of its life) before the next account, which malloc
 * may place at the same address.  Every store to `balance` goes through STORE(),
 * which counts the stores made after the settle time (what a tracer armed by then
 * must see) per source line; at exit the program prints, on stderr,
 * "watchdemo: site LINE COUNT" for every such line, "watchdemo: writes N" and
 * "watchdemo: work_ns N" (the time spent in account_work, for cost measurements).
 * (free() itself may write the first bytes of a freed account: the C library's.)  Built with -O2 -g: the helpers are inlined and every store is
 * still one instruction (a volatile store).
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct account {
	long balance;
	int ops;
	int flags;
	char owner[16];
	long limit;
};

#define MAX_LINE 1000
static long site_writes[MAX_LINE];
static long armed_writes;	/* stores after the settle time */
static int settled;

#define STORE(a, v) do { \
	*(volatile long *)&(a)->balance = (v); \
	site_writes[__LINE__] += settled; \
	armed_writes += settled; \
} while (0)

static inline __attribute__((always_inline)) void deposit(struct account *a, long amount)
{
	STORE(a, a->balance + amount);
}

static inline __attribute__((always_inline)) void charge_fee(struct account *a)
{
	if (a->balance > 10)
		STORE(a, a->balance - 3);
}

__attribute__((noinline)) void account_open(struct account *a, const char *owner)
{
	memset(a, 0, sizeof(*a));
	strncpy(a->owner, owner, sizeof(a->owner) - 1);
	a->limit = 1000;
	STORE(a, 0);
}

__attribute__((noinline)) void account_work(struct account *a, int ops)
{
	int i;

	for (i = 0; i < ops; i++) {
		deposit(a, i + 1);
		if (i % 3 == 0)
			charge_fee(a);
		if (i % 7 == 0)
			STORE(a, a->balance);	/* leaves the value as it was */
		a->ops++;
	}
	if (a->balance > a->limit)
		STORE(a, a->limit);
}

__attribute__((noinline)) long account_close(struct account *a)
{
	long last = a->balance;

	STORE(a, 0);
	return last;
}

__attribute__((noinline)) void account_free(struct account *a)
{
	free(a);
}

static long now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000000000L + ts.tv_nsec;
}

static void sleep_ms(int ms)
{
	struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };

	while (ms > 0 && nanosleep(&ts, &ts) != 0)
		;
}

int main(int argc, char **argv)
{
	int accounts = 3, ops = 50, settle_ms = 300, k, i;
	long total = 0, work_ns = 0;

	for (i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--accounts") && i + 1 < argc)
			accounts = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--ops") && i + 1 < argc)
			ops = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--settle-ms") && i + 1 < argc)
			settle_ms = atoi(argv[++i]);
		else {
			fprintf(stderr, "usage: watchdemo [--accounts N] [--ops N] [--settle-ms M]\n");
			return 2;
		}
	}
	for (k = 0; k < accounts; k++) {
		struct account *a = malloc(sizeof(*a));

		if (!a)
			return 1;
		settled = 0;
		account_open(a, "demo");
		sleep_ms(settle_ms);
		settled = 1;
		work_ns -= now_ns();
		account_work(a, ops);
		work_ns += now_ns();
		total += account_close(a);
		settled = 0;
		account_free(a);
		sleep_ms(settle_ms);
	}
	for (i = 0; i < MAX_LINE; i++)
		if (site_writes[i])
			fprintf(stderr, "watchdemo: site %d %ld\n", i, site_writes[i]);
	fprintf(stderr, "watchdemo: writes %ld\nwatchdemo: total %ld\nwatchdemo: work_ns %ld\n",
		armed_writes, total, work_ns);
	return 0;
}
