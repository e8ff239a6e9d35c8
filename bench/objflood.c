/*
 * objflood: objects made and freed one after another, each called many times: the
 * user-space flood of the memory benchmarks (bench/bench_memlimit.py).
 *
 *   objflood OBJECTS ROUNDS
 *
 * Makes OBJECTS objects in turn (conn_new mallocs, conn_free frees, so later ones reuse
 * earlier ones' addresses); each goes through conn_new, ROUNDS rounds of five methods and
 * conn_free:
 * 2 + 5 * ROUNDS calls, twice as many events (entry and exit).  2,700 objects of 375
 * rounds make 10,135,800 events; of 37 rounds, 1,009,800.
 */
#include <stdio.h>
#include <stdlib.h>

struct conn {
	unsigned long bytes_out;
	unsigned long bytes_in;
	unsigned int packets;
	unsigned int retries;
	int state;
	unsigned short port;
	unsigned char flags;
	unsigned char prio;
};

#define METHOD __attribute__((noinline, used))

METHOD struct conn *conn_new(int i)
{
	struct conn *c = malloc(sizeof(*c));

	if (!c)
		return NULL;
	c->bytes_out = c->bytes_in = 0;
	c->packets = c->retries = 0;
	c->state = 1;
	c->port = (unsigned short)(1024 + i % 60000);
	c->flags = 0;
	c->prio = (unsigned char)(i & 7);
	return c;
}

METHOD void conn_send(struct conn *c, unsigned long n)
{
	c->bytes_out += n;
	c->packets++;
}

METHOD void conn_recv(struct conn *c, unsigned long n)
{
	c->bytes_in += n;
	c->packets++;
}

METHOD int conn_poll(struct conn *c)
{
	return c->state == 1 && c->packets % 7 != 0;
}

METHOD void conn_retry(struct conn *c, int round)
{
	if (round % 11 == 0)
		c->retries++;
	c->flags ^= (unsigned char)(round & 3);
}

METHOD void conn_set_state(struct conn *c, int state)
{
	c->state = state;
}

METHOD void conn_free(struct conn *c)
{
	c->state = 0;
	free(c);
}

int main(int argc, char **argv)
{
	long objects, rounds, i, r;

	if (argc != 3) {
		fprintf(stderr, "usage: %s OBJECTS ROUNDS\n", argv[0]);
		return 2;
	}
	objects = atol(argv[1]);
	rounds = atol(argv[2]);
	for (i = 0; i < objects; i++) {
		struct conn *c = conn_new((int)i);

		if (!c)
			return 1;
		for (r = 0; r < rounds; r++) {
			conn_send(c, 100 + (unsigned long)r);
			conn_recv(c, 50 + (unsigned long)r % 13);
			conn_poll(c);
			conn_retry(c, (int)r);
			conn_set_state(c, 1 + (int)(r % 5 == 4));
		}
		conn_free(c);
	}
	printf("objflood: %ld objects x %ld rounds\n", objects, rounds);
	return 0;
}
