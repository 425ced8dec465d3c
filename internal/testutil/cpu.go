package testutil

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// ProcessCPUSeconds reads user+system CPU time of this process from
// /proc/self/stat (Linux; clock ticks are 100 Hz there). Reading a file
// keeps the benchmark compiling everywhere, unlike syscall.Getrusage.
func ProcessCPUSeconds() (float64, bool) { return statCPUSeconds("/proc/self/stat") }

func statCPUSeconds(path string) (float64, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, false
	}
	utime, err1 := strconv.ParseFloat(f[11], 64)
	stime, err2 := strconv.ParseFloat(f[12], 64)
	if err1 != nil || err2 != nil {
		return 0, false
	}
	return (utime + stime) / 100, true
}

// PIDCPUSeconds is ProcessCPUSeconds of another process.
func PIDCPUSeconds(pid int) (float64, bool) {
	return statCPUSeconds(fmt.Sprintf("/proc/%d/stat", pid))
}
