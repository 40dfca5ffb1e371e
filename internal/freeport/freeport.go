package freeport

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// lowest is the lowest port handed out: below it live the well-known and
// registered ports services of the machine may want later.
const lowest = 20000

// maxTries bounds the binds one call tries.
const maxTries = 1000

// rangeFile is where Linux keeps the ephemeral port range.
const rangeFile = "/proc/sys/net/ipv4/ip_local_port_range"

// ephemeral returns the kernel's ephemeral port range, or Linux's default
// (32768–60999) when it cannot be read.
func ephemeral() (lo, hi int) {
	lo, hi = 32768, 60999
	b, err := os.ReadFile(rangeFile)
	if err != nil {
		return lo, hi
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return lo, hi
	}
	l, err1 := strconv.Atoi(f[0])
	h, err2 := strconv.Atoi(f[1])
	if err1 != nil || err2 != nil || l < 1 || h < l {
		return lo, hi
	}
	return l, h
}

// candidates are the port ranges outside the ephemeral one, at or above
// lowest, as [from, to] pairs.
func candidates() [][2]int {
	lo, hi := ephemeral()
	var r [][2]int
	if lo-1 >= lowest {
		r = append(r, [2]int{lowest, lo - 1})
	}
	if hi+1 <= 65535 {
		r = append(r, [2]int{max(hi+1, lowest), 65535})
	}
	return r
}

// Addrs returns n distinct loopback addresses ("127.0.0.1:port") that
// were free a moment ago, none in the ephemeral range.
func Addrs(n int) ([]string, error) {
	ranges := candidates()
	total := 0
	for _, r := range ranges {
		total += r[1] - r[0] + 1
	}
	if total < n {
		return nil, fmt.Errorf("find %d free ports: only %d ports lie outside the ephemeral range of %s", n, total, rangeFile)
	}
	var held []net.Listener
	defer func() {
		for _, l := range held {
			l.Close()
		}
	}()
	addrs := make([]string, 0, n)
	for try := 0; len(addrs) < n; try++ {
		if try == maxTries {
			return nil, fmt.Errorf("find %d free ports: %d of %d ports tried were taken", n, maxTries-len(addrs), maxTries)
		}
		k := rand.IntN(total)
		port := 0
		for _, r := range ranges {
			if size := r[1] - r[0] + 1; k < size {
				port = r[0] + k
				break
			} else {
				k -= size
			}
		}
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			continue // taken (or reserved); try another
		}
		held = append(held, l)
		addrs = append(addrs, l.Addr().String())
	}
	return addrs, nil
}

// InUse reports whether err is a listener's "address already in use",
// the error a child that lost the race for its port fails with.
func InUse(err error) bool {
	return err != nil && (errors.Is(err, syscall.EADDRINUSE) || strings.Contains(err.Error(), "address already in use"))
}
