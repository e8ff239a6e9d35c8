"""A loopback TCP workload whose time-wait sockets are handed to tracepoints.

Per connection the server closes first; once the client's ACK of its FIN arrives the
server's orphan becomes a time-wait socket (substate FIN_WAIT2).  The client then sends
new data to it, and the time-wait socket answers with a RST: ``tcp_send_reset`` (reason
TCP_TIMEWAIT_SOCKET), ``net_dev_queue`` of the RST and ``kfree_skb`` of the data all
carry a ``struct inet_timewait_sock`` where a ``struct sock *`` is expected.
Prints ``listen PORT``, then ``conn I client_port CPORT``; usage: twreset.py PORT N.
"""

import socket
import sys
import time


def main() -> None:
    port, count = int(sys.argv[1]), int(sys.argv[2])
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(8)
    print(f"listen {port}", flush=True)
    for i in range(count):
        client = socket.create_connection(("127.0.0.1", port))
        server, _ = listener.accept()
        print(f"conn {i} client_port {client.getsockname()[1]}", flush=True)
        server.close()
        time.sleep(0.05)
        try:
            client.send(b"late")
            time.sleep(0.05)
            client.recv(16)
        except OSError:
            pass
        client.close()
    listener.close()


if __name__ == "__main__":
    main()
