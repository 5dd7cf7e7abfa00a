# Distinct cache lines of the word cache touched per burst of 32 datagrams (16 Zipf words each,
# 1,000-word vocabulary: 256 Zipf (s = 1) datagrams drawn as the generator makes its templates, own
# draws, not send's exact stream), for 32-byte slots (2 per line) and
# 16-byte slots (4 per line), 4096 slots per CPU, with the program's hash.
# Run from the repository root: the hash's constants are read from the shared header.
import random, bisect, re
H_TEXT=open("bpf/slipstream_stream.h").read()
def const(name): return int(re.search(r"#define %s (0x[0-9a-fA-F]+|\d+)" % name, H_TEXT).group(1), 0)
M=2**64; MUL1=const("SS_WCC_MUL1"); MUL2=const("SS_WCC_MUL2"); BITS=const("SS_WCC_SLOT_BITS")
def slot(word, stream=0):
    b=word.encode().ljust(16,b'\0'); w0=int.from_bytes(b[:8],'little'); w1=int.from_bytes(b[8:],'little')
    low=(stream<<8)|len(word)
    h=((((w0^low)*MUL1)%M ^ w1)*MUL2)%M
    return h>>(64-BITS)
H=[];acc=0
for k in range(1,1001): acc+=1/k; H.append(acc)
rng=random.Random(0x5eed)
def draw(): return "w%d"%min(bisect.bisect_left(H, rng.random()*H[-1]),999)
for trial in range(2):
    dgrams=[[draw() for _ in range(16)] for _ in range(256)]
    vocab=set(w for d in dgrams for w in d)
    res={}
    for per_line in (2,4):
        tot_words=tot_lines=0; n=0
        for b in range(0,256,32):
            ws=set(w for d in dgrams[b:b+32] for w in d)
            lines=set(slot(w)//per_line for w in ws)
            tot_words+=len(ws); tot_lines+=len(lines); n+=1
        res[per_line]=(tot_words/n, tot_lines/n)
    print("trial",trial,"distinct words in the 256 templates",len(vocab),
          "| per burst of 32 datagrams (512 words): distinct words %.0f, lines 32-byte slots %.0f, 16-byte slots %.0f"%(res[2][0],res[2][1],res[4][1]),
          "| all vocab lines 32B %d 16B %d"%(len(set(slot(w)//2 for w in vocab)), len(set(slot(w)//4 for w in vocab))))
