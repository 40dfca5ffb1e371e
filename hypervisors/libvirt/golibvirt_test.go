package libvirt

import (
	"bytes"
	"net"
	"testing"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"
)

// TestGoLibvirtStreamDataBeforeReply is the go-libvirt bug behind the
// stalls of issue 16, reduced for upstream (docs/libvirt-connections.md):
// go-libvirt takes the first packet with a call's serial as its reply, but
// libvirtd may send a download's stream data, and its end-of-stream
// marker, before the reply (its event loop can run the new stream before
// the worker thread queues the reply: seen on the wire and in libvirtd's
// debug log under CPU load). go-libvirt then drops the data, and when the
// late reply reaches a caller that already stopped listening, its reader
// blocks forever holding the callback lock: the whole connection is dead.
// Every outcome loses the data, so this checks that; it fails the day
// go-libvirt handles the order, and the adapter's workaround (observation
// never downloads, see seedTag) can then be reconsidered.
func TestGoLibvirtStreamDataBeforeReply(t *testing.T) {
	d := newFakeDaemon(t)
	c, err := net.Dial("unix", d.path)
	if err != nil {
		t.Fatal(err)
	}
	l := golibvirt.NewWithDialer(connected{c})
	if err := l.ConnectToURI(golibvirt.QEMUSystem); err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	done := make(chan error, 1)
	go func() { done <- l.StorageVolDownload(golibvirt.StorageVol{Pool: "p", Name: "v"}, &b, 0, 4096, 0) }()
	select {
	case err := <-done:
		if err == nil && b.Len() == 4096 {
			t.Fatal("go-libvirt kept the stream data sent before the reply: the bug is fixed upstream; reconsider the workaround")
		}
		t.Logf("download returned %d of 4096 bytes (err %v): the first data packet was taken for the reply", b.Len(), err)
	case <-time.After(time.Second):
		v := make(chan error, 1)
		go func() { _, err := l.ConnectGetLibVersion(); v <- err }()
		select {
		case err := <-v:
			t.Logf("download never returned; a later call did (%v)", err)
		case <-time.After(time.Second):
			t.Log("download never returned, and neither does any later call: the connection is deadlocked")
		}
	}
}
