# The table of bench/compare, from its results file (comma-separated):
#   system,ranks,bytes,count,plan,iters,time_us,min_us,p10_us,p90_us,max_us,
#   algbw_gbps,busbw_gbps,wrong
# one line per system, rank count and size. Variables from the command line:
# tcp_mbps (iperf3, Mbit/s), memcpy_gbps (GB/s), iperf_seconds, aes_gbps
# (AES-128-GCM on one core, GB/s) and cores (this machine's).
#
# Prints one row per size x ranks x system (sizes and rank counts ascending,
# systems in the order they ran) with the
# median time, the p10-p90 spread, busbw, and the Chorus speedup
# (peer time / Chorus time: above 1 Chorus is faster, below 1 the peer is),
# then the machine limits and, for the largest size, each system's time as a
# fraction of the loopback TCP ceiling of a ring all-reduce, and chorus-tls's
# as a fraction of its crypto bound.

# Adds `value` to the list `list` (count in list[0]) unless it is there.
function add_unique(list, value,    i) {
  for (i = 1; i <= list[0]; ++i) if (list[i] == value) return
  list[++list[0]] = value
}

# Sorts list[1..list[0]] numerically (insertion sort; the lists are short).
function sort_numbers(list,    i, j, v) {
  for (i = 2; i <= list[0]; ++i) {
    v = list[i]
    for (j = i - 1; j >= 1 && list[j] + 0 > v + 0; --j) list[j + 1] = list[j]
    list[j + 1] = v
  }
}

function size_label(b) {
  if (b >= 1048576 && b % 1048576 == 0) return (b / 1048576) " MiB"
  if (b >= 1024 && b % 1024 == 0) return (b / 1024) " KiB"
  return b " B"
}

BEGIN { sizes[0] = 0; rank_counts[0] = 0; systems[0] = 0 }

{
  key = $3 SUBSEP $2 SUBSEP $1
  add_unique(sizes, $3)
  add_unique(rank_counts, $2)
  add_unique(systems, $1)
  sysname[key] = $1
  ranks[key] = $2
  bytes[key] = $3
  plan[key] = $5
  iters[key] = $6
  time_us[key] = $7
  p10[key] = $9
  p90[key] = $10
  busbw[key] = $13
  wrong[key] = $14
  if ($3 + 0 > largest) largest = $3 + 0
}

END {
  sort_numbers(sizes)
  sort_numbers(rank_counts)
  rows = 0
  for (a = 1; a <= sizes[0]; ++a) {
    for (b = 1; b <= rank_counts[0]; ++b) {
      for (c = 1; c <= systems[0]; ++c) {
        k = sizes[a] SUBSEP rank_counts[b] SUBSEP systems[c]
        if (k in time_us) order[++rows] = k
      }
    }
  }
  printf "#\n# speedup = peer time / chorus time (>1: Chorus faster, <1: the peer faster);\n"
  printf "# tcp speedup = the same against chorus-tcp (Chorus planned as for ranks on\n"
  printf "# different hosts: all data through its TCP data plane); for chorus-tls,\n"
  printf "# tcp = chorus-tcp time / chorus-tls time (TLS speed as a fraction of plaintext)\n"
  printf "# time = median over iterations of the slowest rank's time per call;"
  printf " p10-p90 = spread of those times\n"
  printf "# busbw = 2(n-1)/n x bytes / time (nccl-tests), 1 GB = 1e9 B\n#\n"
  printf "%-8s %5s  %-10s %-18s %5s %12s %23s %11s %7s %7s %7s\n", "size",
         "ranks", "system", "plan", "iters", "time (us)", "p10-p90 (us)",
         "busbw GB/s", "speedup", "tcp", "#wrong"
  last = ""
  for (i = 1; i <= rows; ++i) {
    k = order[i]
    group = bytes[k] SUBSEP ranks[k]
    if (last != "" && group != last) print ""
    last = group
    chorus = bytes[k] SUBSEP ranks[k] SUBSEP "chorus"
    chorus_tcp = bytes[k] SUBSEP ranks[k] SUBSEP "chorus-tcp"
    speedup = "-"
    tcp_speedup = "-"
    if (sysname[k] == "chorus-tls" && (chorus_tcp in time_us) &&
        time_us[k] > 0) {
      tcp_speedup = sprintf("%.2fx", time_us[chorus_tcp] / time_us[k])
    }
    if (sysname[k] !~ /^chorus/) {
      if ((chorus in time_us) && time_us[chorus] > 0) {
        speedup = sprintf("%.2fx", time_us[k] / time_us[chorus])
      }
      if ((chorus_tcp in time_us) && time_us[chorus_tcp] > 0) {
        tcp_speedup = sprintf("%.2fx", time_us[k] / time_us[chorus_tcp])
      }
    }
    printf "%-8s %5d  %-10s %-18s %5d %12.1f %23s %11.3f %7s %7s %7d\n",
           size_label(bytes[k]), ranks[k], sysname[k], plan[k], iters[k],
           time_us[k], sprintf("%.1f-%.1f", p10[k], p90[k]), busbw[k], speedup,
           tcp_speedup, wrong[k]
  }

  tcp_bps = tcp_mbps * 1e6 / 8
  printf "\n# machine limits, measured in the same run:\n"
  printf "#   loopback TCP, iperf3 single stream, %s s: %.2f GB/s (%.1f Gbit/s)\n",
         iperf_seconds, tcp_bps / 1e9, tcp_mbps / 1e3
  printf "#   memcpy, one thread, 64 MiB buffers: %.2f GB/s\n", memcpy_gbps
  printf "# TCP ceiling of a ring all-reduce of %s: it moves 2(n-1) x size bytes over\n",
         size_label(largest)
  printf "# TCP per call in total, so ceiling time = 2(n-1) x size / TCP rate;\n"
  printf "# fraction = ceiling time / time (1 = at the ceiling; mpi-shm and chorus on one host use no TCP)\n"
  for (i = 1; i <= rows; ++i) {
    k = order[i]
    if (bytes[k] != largest || time_us[k] <= 0) continue
    n = ranks[k]
    ceiling_us = 2 * (n - 1) * largest / tcp_bps * 1e6
    printf "#   %d ranks %-10s ceiling %9.1f us, time %10.1f us: %5.1f%% of the ceiling\n",
           n, sysname[k], ceiling_us, time_us[k], 100 * ceiling_us / time_us[k]
  }
  if (aes_gbps + 0 <= 0) exit
  printf "# crypto bound of chorus-tls at %s: a ring all-reduce sends 2(n-1) x size\n",
         size_label(largest)
  printf "# bytes in total, each encrypted once and decrypted once, so 4(n-1) x size\n"
  printf "# bytes of AES-128-GCM (%.2f GB/s per core, openssl speed, 16 KiB blocks)\n",
         aes_gbps
  printf "# on min(n, %d cores); fraction = bound time / time (1 = at the bound)\n",
         cores
  for (i = 1; i <= rows; ++i) {
    k = order[i]
    if (bytes[k] != largest || sysname[k] != "chorus-tls" || time_us[k] <= 0) {
      continue
    }
    n = ranks[k]
    used = n < cores ? n : cores
    bound_us = 4 * (n - 1) * largest / (aes_gbps * 1e9 * used) * 1e6
    printf "#   %d ranks %-10s bound %11.1f us, time %10.1f us: %5.1f%% of the bound\n",
           n, sysname[k], bound_us, time_us[k], 100 * bound_us / time_us[k]
  }
}
