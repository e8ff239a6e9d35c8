"""A loopback TCP connection on CPU 0 that only sends keepalive probes, once a second
from its timer (in softirq, on whatever task runs on CPU 0 then), for SECONDS seconds.
Prints ``ready`` once the connection is up.  Usage: keepalive_on_cpu0.py SECONDS"""

import os
import socket
import sys
import time


def main() -> None:
    seconds = float(sys.argv[1])
    os.sched_setaffinity(0, {0})
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    client = socket.create_connection(listener.getsockname())
    server, _ = listener.accept()
    for s in (client, server):
        s.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, 1)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, 1)
    print("ready", flush=True)
    time.sleep(seconds)


if __name__ == "__main__":
    main()
