#!/usr/bin/env bash
# grun.sh LOG cmd...: run cmd inside cgroup s17-17-bench (cpu.shares 65536), this process only.
G=/sys/fs/cgroup/cpu/s17-17-bench
mkdir -p $G; echo 65536 > $G/cpu.shares
LOG=$1; shift
( echo $BASHPID > $G/cgroup.procs; echo "start $(date -u +%T) $(uptime)"; "$@"; echo "end rc=$? $(date -u +%T) $(uptime)" ) >> "$LOG" 2>&1
