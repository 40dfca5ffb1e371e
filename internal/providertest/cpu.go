package providertest

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
)

// CPUSeconds is the CPU time (user and system) process pid has used, from
// /proc/PID/stat (fields 14 and 15, in clock ticks of 1/100 s on Linux).
func CPUSeconds(tb testing.TB, pid int) float64 {
	tb.Helper()
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		tb.Fatal(err)
	}
	// The command name (field 2) is in parentheses and may hold blanks.
	rest := string(raw[bytes.LastIndexByte(raw, ')')+1:])
	f := strings.Fields(rest) // f[0] is field 3
	if len(f) < 13 {
		tb.Fatalf("/proc/%d/stat: %d fields after the name", pid, len(f))
	}
	var ticks float64
	for _, field := range f[11:13] {
		v, err := strconv.ParseFloat(field, 64)
		if err != nil {
			tb.Fatalf("/proc/%d/stat: %v", pid, err)
		}
		ticks += v
	}
	return ticks / 100
}
