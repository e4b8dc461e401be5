# Sourced by benches/gate.sh and benches/wrapper.sh (POSIX sh).
# median_ci FILE: "MEDIAN LO HI" of the numbers in FILE, one per line: the median and its
# 95% confidence interval from the order statistics (ranks n/2 -+ 0.98 sqrt(n),
# distribution-free), for paired differences whose spread is far from normal.
median_ci() {
  sort -n "$1" | awk '{a[NR]=$1} END {
    n=NR; k=int(0.98*sqrt(n)+0.5);
    l=int(n/2)-k; if (l < 1) l=1; h=int(n/2)+1+k; if (h > n) h=n;
    print a[int((n+1)/2)], a[l], a[h]}'
}
