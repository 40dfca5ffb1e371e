package proxmox

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// rawGet returns the body pvesim answers to one GET, as sent on the wire.
func rawGet(t testing.TB, e *env, path string) []byte {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, e.srv.URL+"/api2/json"+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "PVEAPIToken="+testToken+"="+testSecret)
	res, err := e.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil || res.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %v", path, res.StatusCode, err)
	}
	return b
}

// pollOnce runs one uncached cluster-wide VM listing through the adapter
// (retry, classification, go-proxmox decoding, TLS on a kept-alive
// connection) and checks it saw every VM.
func pollOnce(ctx context.Context, b *testing.B, a *Adapter, want int) {
	rs, err := a.list(ctx, true)
	if err != nil {
		b.Fatal(err)
	}
	if len(rs) != want {
		b.Fatalf("listing has %d VMs, want %d", len(rs), want)
	}
}

// BenchmarkClusterVMPoll1000 measures one GET /cluster/resources?type=vm
// poll, the planned short-interval drift detector, at 1,000 VMs (plus the
// template) on pvesim. ns/op and B/op include pvesim building and encoding
// the answer in this process. resp-B/poll is the answer's size as pvesim
// sends it (uncompressed); resp-gzip-B/poll is its gzipped size, for a
// server that compresses for clients accepting gzip, as Go's transport
// asks by default.
func BenchmarkClusterVMPoll1000(b *testing.B) {
	e := newEnv(b, nil, nil)
	fleet(b, e, 1000)
	body := rawGet(b, e, "/cluster/resources?type=vm")
	ctx := ctxT(b, 10*time.Minute)
	pollOnce(ctx, b, e.a, 1001) // open the connection outside the timing
	b.ReportAllocs()
	for b.Loop() {
		pollOnce(ctx, b, e.a, 1001)
	}
	b.ReportMetric(float64(len(body)), "resp-B/poll")
	b.ReportMetric(float64(gzipSize(b, body)), "resp-gzip-B/poll")
}

func gzipSize(t testing.TB, body []byte) int {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	if _, err := zw.Write(body); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Len()
}

// BenchmarkClusterVMPollClient1000 is the same poll with pvesim's answer
// replayed byte for byte by a static TLS handler, so ns/op and B/op are
// the client side alone: what the provider pays per poll on a real
// cluster, network and PVE's own work aside.
func BenchmarkClusterVMPollClient1000(b *testing.B) {
	e := newEnv(b, nil, nil)
	fleet(b, e, 1000)
	body := rawGet(b, e, "/cluster/resources?type=vm")
	static := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/api2/json/cluster/resources" || r.URL.Query().Get("type") != "vm" {
			http.Error(w, "unexpected request", http.StatusNotImplemented)
			return
		}
		w.Header().Set("Content-Type", "application/json;charset=UTF-8")
		_, _ = w.Write(body)
	}))
	static.EnableHTTP2 = false
	static.StartTLS()
	b.Cleanup(static.Close)
	cfg := e.cfg
	sum := sha256.Sum256(static.Certificate().Raw)
	cfg.APIURL, cfg.Fingerprint = static.URL+"/api2/json", hex.EncodeToString(sum[:])
	a, err := New(cfg, nil)
	if err != nil {
		b.Fatal(err)
	}
	ctx := ctxT(b, 10*time.Minute)
	pollOnce(ctx, b, a, 1001)
	b.ReportAllocs()
	for b.Loop() {
		pollOnce(ctx, b, a, 1001)
	}
	b.ReportMetric(float64(len(body)), "resp-B/poll")
}
