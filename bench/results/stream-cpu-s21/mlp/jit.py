# dumps the JIT image of every function of the loaded program named sys.argv[1] to /tmp/s21p/jit-<ksym>.bin
import ctypes, struct, sys, os
libc = ctypes.CDLL(None, use_errno=True)
NR_bpf = 321
def bpf(cmd, attr):
    buf = ctypes.create_string_buffer(attr, 128)
    r = libc.syscall(NR_bpf, cmd, buf, 128)
    return r, buf.raw
want = sys.argv[1]
pid = 0
while True:
    r, raw = bpf(11, struct.pack('<II', pid, 0))
    if r < 0: break
    pid = struct.unpack_from('<I', raw, 4)[0]
    fd, _ = bpf(13, struct.pack('<I', pid))
    if fd < 0: continue
    info = ctypes.create_string_buffer(256)
    r, _ = bpf(15, struct.pack('<IIQ', fd, 256, ctypes.addressof(info)))
    name = info.raw[64:80].split(b'\0')[0].decode()
    if name != want: os.close(fd); continue
    jlen, = struct.unpack_from('<I', info.raw, 16)
    nks, nfl = struct.unpack_from('<II', info.raw, 104)
    img = ctypes.create_string_buffer(jlen); ks = (ctypes.c_uint64 * nks)(); fl = (ctypes.c_uint32 * nfl)()
    info2 = bytearray(256)
    struct.pack_into('<I', info2, 16, jlen); struct.pack_into('<Q', info2, 24, ctypes.addressof(img))
    struct.pack_into('<II', info2, 104, nks, nfl); struct.pack_into('<QQ', info2, 112, ctypes.addressof(ks), ctypes.addressof(fl))
    b = ctypes.create_string_buffer(bytes(info2), 256)
    r, _ = bpf(15, struct.pack('<IIQ', fd, 256, ctypes.addressof(b)))
    off = 0
    syms = {int(l.split()[0], 16): l.split()[2] for l in open('/proc/kallsyms') if '[bpf]' in l}
    for i in range(nfl):
        nm = syms.get(ks[i], hex(ks[i]))
        open(f'/tmp/s21p/jit-{nm.split("_",3)[-1]}.bin', 'wb').write(img.raw[off:off+fl[i]])
        print(pid, nm, fl[i])
        off += fl[i]
    break
