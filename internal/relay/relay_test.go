package relay

import (
	"bufio"
	"net"
	"testing"
	"time"
)

func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				s := bufio.NewScanner(c)
				for s.Scan() {
					c.Write(append(s.Bytes(), '\n'))
				}
			}()
		}
	}()
	return ln.Addr().String()
}

func roundTrip(c net.Conn, msg string, wait time.Duration) (string, error) {
	c.SetDeadline(time.Now().Add(wait))
	if _, err := c.Write([]byte(msg + "\n")); err != nil {
		return "", err
	}
	return bufio.NewReader(c).ReadString('\n')
}

// Forward, freeze (bytes stop, the connection stays), thaw, cut (the
// connection ends, new ones are refused), restore.
func TestRelay(t *testing.T) {
	r, err := New(echoServer(t))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	c, err := net.Dial("tcp", r.Addr())
	if err != nil {
		t.Fatal(err)
	}
	if got, err := roundTrip(c, "a", 2*time.Second); err != nil || got != "a\n" {
		t.Fatalf("forward: %q %v", got, err)
	}
	r.Freeze()
	if got, err := roundTrip(c, "b", 200*time.Millisecond); err == nil {
		t.Fatalf("frozen relay forwarded %q", got)
	}
	r.Thaw()
	c.Close()
	c, err = net.Dial("tcp", r.Addr())
	if err != nil {
		t.Fatal(err)
	}
	if got, err := roundTrip(c, "c", 2*time.Second); err != nil || got != "c\n" {
		t.Fatalf("after thaw: %q %v", got, err)
	}
	r.Cut()
	if _, err := roundTrip(c, "d", 2*time.Second); err == nil {
		t.Fatal("cut relay kept the connection")
	}
	if _, err := net.Dial("tcp", r.Addr()); err == nil {
		t.Fatal("cut relay accepted a connection")
	}
	if err := r.Restore(); err != nil {
		t.Fatal(err)
	}
	c, err = net.Dial("tcp", r.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got, err := roundTrip(c, "e", 2*time.Second); err != nil || got != "e\n" {
		t.Fatalf("after restore: %q %v", got, err)
	}
}
