#!/usr/bin/env python3
"""Send memcached UDP requests and print the replies as JSON (runs inside the client netns).

Input (argv[1]): JSON list of [family, host, port, request_id, request_text]; output: JSON list
of replies (payload after the 8-byte frame header, latin-1 string) or null on timeout (0.5 s).
Not for load: one request at a time, each bounded by the timeout.
"""
import json
import socket
import sys

out = []
for fam, host, port, rid, req in json.loads(sys.argv[1]):
    af = socket.AF_INET6 if fam == 6 else socket.AF_INET
    s = socket.socket(af, socket.SOCK_DGRAM)
    s.settimeout(0.5)
    frame = rid.to_bytes(2, "big") + b"\x00\x00\x00\x01\x00\x00" + req.encode("latin-1")
    s.sendto(frame, (host, port))
    try:
        data = s.recv(65535)
        if data[:2] != rid.to_bytes(2, "big") or data[2:8] != b"\x00\x00\x00\x01\x00\x00":
            out.append("BAD FRAME HEADER " + data[:8].hex())
        else:
            out.append(data[8:].decode("latin-1"))
    except socket.timeout:
        out.append(None)
    s.close()
print(json.dumps(out))
