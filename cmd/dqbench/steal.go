package main

import (
	"bufio"
	"math"
	"os"
	"strconv"
	"strings"
)

// cpuTimes is the machine's CPU time so far, from /proc/stat, in clock
// ticks.
type cpuTimes struct {
	steal, total uint64
	ok           bool
}

// readCPU reads the "cpu" line of /proc/stat: user, nice, system, idle,
// iowait, irq, softirq and steal add up to the total (guest time is
// counted in user already). It reports !ok where there is no /proc/stat.
func readCPU() cpuTimes {
	f, err := os.Open("/proc/stat")
	if err != nil {
		return cpuTimes{}
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	if !sc.Scan() {
		return cpuTimes{}
	}
	return parseCPULine(sc.Text())
}

func parseCPULine(line string) cpuTimes {
	fields := strings.Fields(line)
	if len(fields) < 9 || fields[0] != "cpu" {
		return cpuTimes{}
	}
	var t cpuTimes
	for i, f := range fields[1:9] {
		v, err := strconv.ParseUint(f, 10, 64)
		if err != nil {
			return cpuTimes{}
		}
		t.total += v
		if i == 7 {
			t.steal = v
		}
	}
	t.ok = true
	return t
}

// stealPercent is the share of CPU time stolen from the machine between a
// and b, in percent; NaN when unknown.
func stealPercent(a, b cpuTimes) float64 {
	if !a.ok || !b.ok || b.total <= a.total {
		return math.NaN()
	}
	return 100 * float64(b.steal-a.steal) / float64(b.total-a.total)
}
