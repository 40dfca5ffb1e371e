package pvesim

import (
	"fmt"
	"sync"
	"testing"

	"github.com/h2non/gock"
	"github.com/luthermonson/go-proxmox/tests/mocks/config"
	"github.com/luthermonson/go-proxmox/tests/mocks/pve7x"
	"github.com/luthermonson/go-proxmox/tests/mocks/pve8x"
	"github.com/luthermonson/go-proxmox/tests/mocks/pve9x"
)

// recordingsModule names the source of the recorded PVE answers: the mock
// packages tests/mocks/pve8x and tests/mocks/pve9x (and pve7x, used only
// as supporting evidence) of this exact module version, the one go.mod
// pins for the adapter, imported as test data. Some of these answers are
// captures of real servers (the PVE 7.4 node status, the /cluster/resources
// listing); others are hand-written fixtures, and where those contradict
// PVE's own source the deviations table in shape_test.go says so.
const recordingsModule = "github.com/luthermonson/go-proxmox@v0.8.2"

// recording is one answer registered by go-proxmox's mock packages.
type recording struct {
	status int
	body   []byte
}

var (
	recOnce sync.Once
	recs    map[string]map[string]recording // PVE major -> recording key -> answer
	recErr  error
)

// recordingKey names a mock the way it was registered: method, the path
// pattern as written in the mock file, and its query matchers, e.g.
// "GET ^/pools/$?poolid=test-pool".
func recordingKey(r *gock.Request) string {
	k := r.Method + " " + r.URLStruct.Path
	if q := r.URLStruct.RawQuery; q != "" {
		k += "?" + q
	}
	return k
}

// loadRecordings registers each version's mocks with gock, copies every
// answer out and unregisters them again. gock swaps http.DefaultTransport
// while mocks are registered; gock.Off restores it before any request of
// this package runs (the simulator's tests use their server's own client).
func loadRecordings(t *testing.T) map[string]map[string]recording {
	t.Helper()
	recOnce.Do(func() {
		defer gock.Off()
		config.C = config.Config{URI: "https://pve.invalid:8006/api2/json"}
		recs = map[string]map[string]recording{}
		for major, load := range map[string]func(){"7": pve7x.Load, "8": pve8x.Load, "9": pve9x.Load} {
			gock.Flush()
			load()
			m := map[string]recording{}
			for _, mock := range gock.GetAll() {
				k := recordingKey(mock.Request())
				if _, dup := m[k]; dup {
					// The first registration wins in gock's matcher; keep it.
					continue
				}
				res := mock.Response()
				m[k] = recording{status: res.StatusCode, body: append([]byte(nil), res.BodyBuffer...)}
			}
			if len(m) == 0 {
				recErr = fmt.Errorf("%s tests/mocks/pve%sx registered no answers", recordingsModule, major)
				return
			}
			recs[major] = m
		}
	})
	if recErr != nil {
		t.Fatal(recErr)
	}
	return recs
}

// recorded returns the named answers of one version, failing the test if
// a name is unknown (a renamed mock must not silently drop coverage).
func recorded(t *testing.T, major string, keys []string) []recording {
	t.Helper()
	all := loadRecordings(t)[major]
	var out []recording
	for _, k := range keys {
		r, ok := all[k]
		if !ok {
			t.Fatalf("PVE %s: no recording %q in %s tests/mocks/pve%sx", major, k, recordingsModule, major)
		}
		out = append(out, r)
	}
	return out
}
