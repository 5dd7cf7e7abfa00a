import os, time, resource
p = "/tmp/h15-fa.log"
def run(kind):
    if os.path.exists(p): os.unlink(p)
    fd = os.open(p, os.O_RDWR | os.O_CREAT, 0o644)
    if kind == "reuse":
        os.write(fd, b"\0" * (48 << 20)); os.fdatasync(fd)
    rec = b"x" * (50 * 1030)
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    off = 0
    for i in range(800):
        os.pwrite(fd, rec, off); off += len(rec)
        os.fdatasync(fd)
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    os.close(fd)
    print(kind, "cpu %.3f s" % (r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime))
for k in ["append", "reuse", "reuse", "append", "append", "reuse"]:
    run(k)
os.unlink(p)
