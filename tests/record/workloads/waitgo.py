"""A loopback TCP workload that starts when told: listens, prints ``listen PORT`` and
waits for a line on stdin; then per connection a client sends a few small messages the
server reads without answering, with pauses (past the quick-ACK start the server's ACKs
may be delayed and sent by its timer, in softirq), and both close; the first
connection's client sends keepalive probes first (its timer, in softirq, while the
process sleeps).  Prints ``conn I
client_port CPORT`` per connection.  Usage: waitgo.py PORT CONNECTIONS [COMM] (COMM:
the process name to take first, for ``--comm``)."""

import ctypes
import socket
import sys
import time


def main() -> None:
    port, count = int(sys.argv[1]), int(sys.argv[2])
    if len(sys.argv) > 3:
        pr_set_name = 15
        ctypes.CDLL(None).prctl(pr_set_name, sys.argv[3].encode()[:15], 0, 0, 0)
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(8)
    print(f"listen {port}", flush=True)
    sys.stdin.readline()
    for i in range(count):
        client = socket.create_connection(("127.0.0.1", port))
        server, _ = listener.accept()
        print(f"conn {i} client_port {client.getsockname()[1]}", flush=True)
        if i == 0:  # keepalive probes, sent by the socket's timer in softirq, while idle
            client.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, 1)
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, 1)
            time.sleep(2.5)
        for _ in range(6):
            client.send(b"x" * 100)
            server.recv(100)
            time.sleep(0.06)
        client.close()
        server.close()
    listener.close()


if __name__ == "__main__":
    main()
