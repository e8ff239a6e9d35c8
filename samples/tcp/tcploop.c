/*
 * tcploop: a loopback TCP workload whose every socket a test can check.
 *
 * One process listens on 127.0.0.1 (a port the kernel picks, or --port) and makes
 * --connections connections to itself, one after another.  On each, client and
 * server exchange --messages request/response pairs of --bytes bytes, then the
 * connection ends in one of three ways, in turn:
 *   0  orderly close, client first (client FIN_WAIT1 -> FIN_WAIT2 -> TIME_WAIT)
 *   1  orderly close, server first (server side goes through FIN_WAIT, client CLOSE_WAIT)
 *   2  abort: the client sets SO_LINGER {1, 0} and closes, sending a RST
 * It prints one line per socket to stdout, for the test's ground truth:
 *   listen PORT
 *   conn I client_port CPORT server_port PORT close client|server|abort
 * and waits --settle-ms before closing the listener, so that the transitions the
 * kernel makes in softirq after the last close happen while it is still traced.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static const char *const CLOSE_NAMES[] = {"client", "server", "abort"};

static void die(const char *what)
{
	fprintf(stderr, "tcploop: %s: %s\n", what, strerror(errno));
	exit(1);
}

static long number(const char *text, const char *option)
{
	char *end;
	long v = strtol(text, &end, 10);

	if (*text == '\0' || *end != '\0' || v < 0) {
		fprintf(stderr, "tcploop: %s needs a non-negative number\n", option);
		exit(2);
	}
	return v;
}

static void send_all(int fd, const char *buf, size_t len)
{
	while (len) {
		ssize_t n = send(fd, buf, len, 0);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			die("send");
		}
		buf += n;
		len -= (size_t)n;
	}
}

static void recv_all(int fd, char *buf, size_t len)
{
	while (len) {
		ssize_t n = recv(fd, buf, len, 0);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			die("recv");
		buf += n;
		len -= (size_t)n;
	}
}

/* Reads until end of file (or a reset, for the aborted connection). */
static void drain(int fd)
{
	char buf[256];

	for (;;) {
		ssize_t n = recv(fd, buf, sizeof(buf), 0);

		if (n > 0 || (n < 0 && errno == EINTR))
			continue;
		return;
	}
}

static unsigned short local_port(int fd)
{
	struct sockaddr_in a;
	socklen_t len = sizeof(a);

	if (getsockname(fd, (struct sockaddr *)&a, &len) < 0)
		die("getsockname");
	return ntohs(a.sin_port);
}

int main(int argc, char **argv)
{
	long connections = 6, messages = 2, bytes = 64, port = 0, settle_ms = 200;
	struct sockaddr_in addr;
	int one = 1, listener;
	char *buf;

	for (int i = 1; i < argc; i++) {
		const char *v = i + 1 < argc ? argv[i + 1] : NULL;

		if (!v) {
			fprintf(stderr, "usage: tcploop [--connections N] [--messages N] "
					"[--bytes N] [--port N] [--settle-ms N]\n");
			return 2;
		}
		if (!strcmp(argv[i], "--connections"))
			connections = number(v, argv[i]);
		else if (!strcmp(argv[i], "--messages"))
			messages = number(v, argv[i]);
		else if (!strcmp(argv[i], "--bytes"))
			bytes = number(v, argv[i]);
		else if (!strcmp(argv[i], "--port"))
			port = number(v, argv[i]);
		else if (!strcmp(argv[i], "--settle-ms"))
			settle_ms = number(v, argv[i]);
		else {
			fprintf(stderr, "tcploop: unknown option %s\n", argv[i]);
			return 2;
		}
		i++;
	}
	if (bytes < 1 || bytes > 1 << 20 || port > 65535) {
		fprintf(stderr, "tcploop: --bytes 1..1048576, --port 0..65535\n");
		return 2;
	}
	buf = calloc(1, (size_t)bytes);
	if (!buf)
		die("calloc");

	listener = socket(AF_INET, SOCK_STREAM, 0);
	if (listener < 0)
		die("socket");
	setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	memset(&addr, 0, sizeof(addr));
	addr.sin_family = AF_INET;
	addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	addr.sin_port = htons((unsigned short)port);
	if (bind(listener, (struct sockaddr *)&addr, sizeof(addr)) < 0)
		die("bind");
	if (listen(listener, 16) < 0)
		die("listen");
	addr.sin_port = htons(local_port(listener));
	printf("listen %u\n", local_port(listener));

	for (long i = 0; i < connections; i++) {
		int how = (int)(i % 3);
		int client = socket(AF_INET, SOCK_STREAM, 0), server;

		if (client < 0)
			die("socket");
		if (connect(client, (struct sockaddr *)&addr, sizeof(addr)) < 0)
			die("connect");
		server = accept(listener, NULL, NULL);
		if (server < 0)
			die("accept");
		for (long m = 0; m < messages; m++) {
			send_all(client, buf, (size_t)bytes);
			recv_all(server, buf, (size_t)bytes);
			send_all(server, buf, (size_t)bytes);
			recv_all(client, buf, (size_t)bytes);
		}
		printf("conn %ld client_port %u server_port %u close %s\n", i, local_port(client),
		       ntohs(addr.sin_port), CLOSE_NAMES[how]);
		if (how == 0) {
			close(client);
			drain(server);
			close(server);
		} else if (how == 1) {
			close(server);
			drain(client);
			close(client);
		} else {
			struct linger abort_now = {1, 0};

			if (setsockopt(client, SOL_SOCKET, SO_LINGER, &abort_now,
				       sizeof(abort_now)) < 0)
				die("SO_LINGER");
			close(client);
			drain(server);
			close(server);
		}
	}
	fflush(stdout);
	if (settle_ms) {
		struct timespec t = {settle_ms / 1000, (settle_ms % 1000) * 1000000L};

		nanosleep(&t, NULL);
	}
	close(listener);
	free(buf);
	return 0;
}
