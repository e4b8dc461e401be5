# Used by benches/gate.sh: each `runc run`'s hook lifetimes, from the sched and signal
# events of `perf script -F comm,pid,tid,time,event,trace` (time-ordered). runc waits for
# each hook before it goes on, so a hook's lifetime inside runc is the time the hook adds
# to `runc run`: from its fork by runc to the SIGCHLD its exit sends runc (which is what
# wakes runc's wait). Not to sched_process_exit: that fires before the exiting process
# drops its memory and files, which costs devgate ~100 us more than /bin/true.
#   awk -v root=PID -v runc=PATH -v hook=PATH -v truebin=PATH -f hook-trace.awk SEQ TRACE
# root: the bench's shell, whose descendants exec'ing `runc` are the measured runs (other
# processes on the machine may run runc too). SEQ: "PAIR CASE" per measured run, in the
# order they ran. Prints per run, in that order, in microseconds:
#   PAIR CASE RUN PRESTART POSTSTOP TEARDOWN
# RUN: runc's exec -> its SIGCHLD; TEARDOWN: both hooks' exit -> SIGCHLD. On a mismatch it
# prints one line "error: WHY" instead. Times are kept as integer microseconds (perf
# prints seconds with 6 decimals), exact in awk's doubles.
function usec(s) { sub(/\./, "", s); return s + 0 }
function below_root(p, d) { # whether p descends from root within a few forks
  for (d = 0; d < 6 && (p in parent); d++) { p = parent[p]; if (p == root) return 1 }
  return 0
}
NR == FNR { nseq++; seqpair[nseq] = $1; seqcase[nseq] = $2; next }
{
  # "COMM PID/TID TIME: SYSTEM:EVENT: FIELDS"; COMM may hold spaces, so find the rest.
  # TID is -1 (COMM ":-1") where perf no longer knows the thread: the SIGCHLD sent as a
  # process whose leader exited first dies.
  if (!match($0, / [0-9]+\/-?[0-9]+ +[0-9]+\.[0-9]+: +[a-z]+:[a-z_]+: /)) next
  head = substr($0, RSTART + 1, RLENGTH - 1); rest = substr($0, RSTART + RLENGTH)
  split(head, h, " "); split(h[1], id, "/"); tgid = id[1] + 0
  t = h[2]; sub(/:$/, "", t); t = usec(t)
  ev = h[3]; sub(/:$/, "", ev)
  if (ev == "sched:sched_process_fork") {
    if (!match(rest, / child_pid=[0-9]+$/)) next
    c = substr(rest, RSTART + 11) + 0; parent[c] = tgid; forkt[c] = t
  } else if (ev == "sched:sched_process_exec") {
    if (!match(rest, / pid=[0-9]+ old_pid=[0-9]+$/)) next
    fn = substr(rest, 1, RSTART - 1); sub(/^filename=/, "", fn)
    if (fn == runc && below_root(tgid)) { nrun++; run[nrun] = tgid; isrun[tgid] = nrun; t0[nrun] = t }
    else if ((tgid in parent) && (parent[tgid] in isrun) && (fn == hook || fn == truebin) && (tgid in forkt)) {
      r = isrun[parent[tgid]]; nh[r]++; hookof[tgid] = r SUBSEP nh[r]; hstart[r, nh[r]] = forkt[tgid]
    }
  } else if (ev == "sched:sched_process_exit") {
    if (rest ~ /group_dead=true$/ && (tgid in hookof)) hexit[hookof[tgid]] = t
  } else if (ev == "signal:signal_generate") {
    # the exit's notice to the parent, sent by the process's last thread as it dies
    if (rest !~ /^sig=17 /) next
    if (tgid in hookof) { if (hookof[tgid] in hexit) { hend[hookof[tgid]] = t; delete hookof[tgid] } }
    else if (tgid in isrun) { t1[isrun[tgid]] = t; delete isrun[tgid] }
  }
}
END {
  if (nrun != nseq) { printf "error: %d runc runs in the trace, %d run\n", nrun, nseq; exit }
  for (i = 1; i <= nrun; i++) {
    if (!(i in t1) || nh[i] != 2 || !((i, 1) in hend) || !((i, 2) in hend)) {
      printf "error: run %d (%s, pid %d): %d hooks, or an exit missing from the trace\n", i, seqcase[i], run[i], nh[i]
      exit
    }
    printf "%s %s %d %d %d %d\n", seqpair[i], seqcase[i], t1[i] - t0[i],
      hend[i, 1] - hstart[i, 1], hend[i, 2] - hstart[i, 2],
      hend[i, 1] - hexit[i, 1] + hend[i, 2] - hexit[i, 2]
  }
}
