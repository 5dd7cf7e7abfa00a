import os, sys, time, resource, subprocess
def run(pre):
    p = "/tmp/h15-fa.log"
    if os.path.exists(p): os.unlink(p)
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    if pre:
        os.posix_fallocate  # not keep-size; use util-linux
        subprocess.run(["fallocate", "-n", "-l", str(48 << 20), p], check=True)
    rec = b"x" * (50 * 1030)   # one turn: 50 entries of ~1 KiB
    r0 = resource.getrusage(resource.RUSAGE_SELF); t0 = time.time()
    for i in range(800):       # ~41 MB
        os.write(fd, rec)
        os.fdatasync(fd)
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    os.close(fd)
    print("prealloc" if pre else "plain   ", "cpu %.3f s (sys %.3f) wall %.2f size %d" % (r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime, r1.ru_stime - r0.ru_stime, time.time() - t0, os.path.getsize(p)))
for pre in [0, 1, 1, 0, 0, 1]:
    run(pre)
os.unlink("/tmp/h15-fa.log")
