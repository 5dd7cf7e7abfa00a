// Session 22, issue 12: how fast this VM's caches lose a table the core is not touching.
// Every round touches B random 64-byte lines of a T-byte table as a dependent chain (each address
// waits for the previous load, as the word-count program's slot loads wait on the tag compare),
// then waits P us, sleeping (the vCPU halts) or spinning (it never halts). Prints the mean ns per
// touch over rounds 4..R. Usage: cold T B P spin huge R (huge: MADV_HUGEPAGE on the table).
// Build: gcc -O2 -o cold cold.c; run pinned: taskset -c 0 ./cold 131072 208 1600 1 0 1000.
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <sys/mman.h>
static uint64_t now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1000000000ull+t.tv_nsec;}
int main(int argc,char**argv){
  size_t T=atol(argv[1]); int B=atoi(argv[2]); int P=atoi(argv[3]); int spin=atoi(argv[4]); int huge=atoi(argv[5]); int rounds=atoi(argv[6]);
  char*buf=mmap(0,T+(2<<20),PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS,-1,0);
  buf=(char*)(((uintptr_t)buf+(2<<20)-1)&~((uintptr_t)(2<<20)-1));
  madvise(buf,T,huge?MADV_HUGEPAGE:MADV_NOHUGEPAGE);
  memset(buf,1,T);
  size_t lines=T/64; uint32_t*idx=malloc(sizeof(uint32_t)*B); uint64_t seed=12345;
  uint64_t total=0,cnt=0; volatile uint64_t sink=0;
  for(int r=0;r<rounds;r++){
    for(int i=0;i<B;i++){seed=seed*6364136223846793005ull+1442695040888963407ull; idx[i]=(seed>>33)%lines;}
    // dependent chain so each touch's latency shows (like the tag load feeding a branch)
    uint64_t t0=now(); uint64_t acc=0;
    for(int i=0;i<B;i++){ acc+= *(volatile uint64_t*)(buf+(size_t)((idx[i]+(acc>>62))%lines)*64); }
    uint64_t t1=now(); sink+=acc;
    if(r>=3){total+=t1-t0;cnt+=B;}
    uint64_t until=now()+P*1000ull;
    if(spin){while(now()<until);} else {struct timespec ts={0,P*1000};nanosleep(&ts,0);}
  }
  printf("T=%zu B=%d P=%dus spin=%d huge=%d: %.1f ns/touch\n",T,B,P,spin,huge,(double)total/cnt);
  return 0;
}
