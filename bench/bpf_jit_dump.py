#!/usr/bin/env python3
"""bpf_jit_dump.py — the JIT-compiled x86 code of a loaded BPF program, one file per function.

For: reading a live profile of an XDP program at instruction level on a host whose bpftool has
no disassembler ("No libbfd support") and whose perf cannot annotate BPF ("link with
libopcode"): perf still names samples `bpf_prog_<tag>_<func>+0xOFF`, and this script writes each
function's machine code so `objdump -b binary -m i386:x86-64 -D FILE` shows what sits at OFF.
Reads the image with BPF_OBJ_GET_INFO_BY_FD (jited_prog_insns, jited_ksyms, jited_func_lens),
the same call bpftool makes. Root; the program must be loaded (run the daemon or
`examples/stream_cost` meanwhile).

Usage: bpf_jit_dump.py PROG_NAME OUT_DIR   (PROG_NAME: the entry program, e.g. slipstream_xdp)
Not for: profiling itself (perf record) or anything the project runs in tests.
"""
import ctypes
import os
import struct
import sys

NR_BPF = 321  # x86-64
BPF_PROG_GET_NEXT_ID, BPF_PROG_GET_FD_BY_ID, BPF_OBJ_GET_INFO_BY_FD = 11, 13, 15
INFO_BYTES = 256  # enough for the fields used; the kernel zero-fills / checks the rest
# struct bpf_prog_info offsets (include/uapi/linux/bpf.h)
OFF_JITED_LEN, OFF_JITED_INSNS, OFF_NAME = 16, 24, 64
OFF_NR_KSYMS, OFF_KSYMS = 104, 112

libc = ctypes.CDLL(None, use_errno=True)


def bpf(cmd, attr):
    buf = ctypes.create_string_buffer(attr, 128)
    return libc.syscall(NR_BPF, cmd, buf, 128), buf.raw


def prog_info(fd, info):
    r, _ = bpf(BPF_OBJ_GET_INFO_BY_FD, struct.pack("<IIQ", fd, INFO_BYTES, ctypes.addressof(info)))
    return r


def find(name):
    """The fd of the first loaded program called `name`, or None."""
    prog_id = 0
    while True:
        r, raw = bpf(BPF_PROG_GET_NEXT_ID, struct.pack("<II", prog_id, 0))
        if r < 0:
            return None
        prog_id = struct.unpack_from("<I", raw, 4)[0]
        fd, _ = bpf(BPF_PROG_GET_FD_BY_ID, struct.pack("<I", prog_id))
        if fd < 0:
            continue
        info = ctypes.create_string_buffer(INFO_BYTES)
        if prog_info(fd, info) == 0 and info.raw[OFF_NAME:OFF_NAME + 16].split(b"\0")[0].decode() == name:
            return fd
        os.close(fd)


def dump(fd, out_dir):
    info = ctypes.create_string_buffer(INFO_BYTES)
    prog_info(fd, info)
    jlen, = struct.unpack_from("<I", info.raw, OFF_JITED_LEN)
    nks, nfl = struct.unpack_from("<II", info.raw, OFF_NR_KSYMS)
    img, ksyms, lens = ctypes.create_string_buffer(jlen), (ctypes.c_uint64 * nks)(), (ctypes.c_uint32 * nfl)()
    req = bytearray(INFO_BYTES)
    struct.pack_into("<I", req, OFF_JITED_LEN, jlen)
    struct.pack_into("<Q", req, OFF_JITED_INSNS, ctypes.addressof(img))
    struct.pack_into("<IIQQ", req, OFF_NR_KSYMS, nks, nfl, ctypes.addressof(ksyms), ctypes.addressof(lens))
    buf = ctypes.create_string_buffer(bytes(req), INFO_BYTES)
    if prog_info(fd, buf) != 0:
        sys.exit("bpf_jit_dump: BPF_OBJ_GET_INFO_BY_FD failed (root? bpf_jit_kallsyms?)")
    names = {}
    with open("/proc/kallsyms") as f:
        for line in f:
            if "[bpf]" in line:
                addr, _, sym = line.split()[:3]
                names[int(addr, 16)] = sym
    off = 0
    for i in range(nfl):
        sym = names.get(ksyms[i], "func%d" % i)
        path = os.path.join(out_dir, sym + ".bin")
        with open(path, "wb") as f:
            f.write(img.raw[off:off + lens[i]])
        print("%s %d bytes -> %s" % (sym, lens[i], path))
        off += lens[i]


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    fd = find(sys.argv[1])
    if fd is None:
        sys.exit("bpf_jit_dump: no loaded program named %s" % sys.argv[1])
    os.makedirs(sys.argv[2], exist_ok=True)
    dump(fd, sys.argv[2])


if __name__ == "__main__":
    main()
