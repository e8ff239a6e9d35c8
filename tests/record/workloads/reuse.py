"""A loopback TCP workload whose socket addresses are handed out again to sockets that
never leave TCP_CLOSE.

Pinned to one CPU (the slab allocator hands a just-freed object out again on the CPU
that freed it), each round connects a client to a listener, aborts the client (SO_LINGER
0: its socket is destroyed in close()), closes the accepted socket, then makes sockets
that are never bound nor connected and closes them: created in TCP_CLOSE, destroyed in
TCP_CLOSE, often at an address a destroyed socket had.
Prints ``listen PORT``; usage: reuse.py PORT ROUNDS.
"""

import os
import socket
import struct
import sys


def main() -> None:
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    port, rounds = int(sys.argv[1]), int(sys.argv[2])
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(8)
    print(f"listen {port}", flush=True)
    for _ in range(rounds):
        client = socket.create_connection(("127.0.0.1", port))
        server, _ = listener.accept()
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        client.close()
        server.close()
        for s in [socket.socket() for _ in range(3)]:
            s.close()
    listener.close()


if __name__ == "__main__":
    main()
