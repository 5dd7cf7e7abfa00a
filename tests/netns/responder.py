#!/usr/bin/env python3
"""Stand-in for the user-space server in the netns test: answers every memcached UDP datagram
that reaches user space with "END\\r\\n" (v4 and v6), proving the kernel passed it up.
Not a memcached implementation. Exits after argv[2] seconds."""
import select
import socket
import sys
import time

port, lifetime = int(sys.argv[1]), float(sys.argv[2])
socks = []
for af, host in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):
    s = socket.socket(af, socket.SOCK_DGRAM)
    if af == socket.AF_INET6:
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    s.bind((host, port))
    socks.append(s)
print("ready", flush=True)
end = time.monotonic() + lifetime
while time.monotonic() < end:
    r, _, _ = select.select(socks, [], [], 0.2)
    for s in r:
        data, addr = s.recvfrom(65535)
        if len(data) >= 8:
            s.sendto(data[:2] + b"\x00\x00\x00\x01\x00\x00" + b"END\r\n", addr)
