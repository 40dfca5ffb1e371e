package server

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"time"

	"github.com/bigfleet-vm/provider/conffile"
	"github.com/bigfleet-vm/provider/config"
	"github.com/bigfleet-vm/provider/desired"
	"github.com/bigfleet-vm/provider/etcdstore"
	"github.com/bigfleet-vm/provider/jsonhistory"
	"github.com/bigfleet-vm/provider/statefile"
)

// HistoryQuery is what `provider history` and /debug/history ask: one
// machine, or every machine with events since Since (0: all), in Zone and
// State (empty: any; DELETED names machines that left the document).
type HistoryQuery struct {
	Machine string
	Since   time.Duration
	Zone    string
	State   string
}

// maxSince bounds a fleet timeline's --since.
const maxSince = 30 * 24 * time.Hour

// check refuses a query that cannot be answered.
func (q HistoryQuery) check() error {
	if q.Machine != "" && (q.Since != 0 || q.Zone != "" || q.State != "") {
		return errors.New("a machine's history takes no --since, --zone or --state; those select a fleet timeline")
	}
	if q.Since < 0 || q.Since > maxSince {
		return fmt.Errorf("since must be between 0s and %s", maxSince)
	}
	if q.State != "" && q.State != "DELETED" {
		if _, ok := desired.ParseState(q.State); !ok {
			return fmt.Errorf("state %s is not a machine state (SPECULATIVE, CREATING, IDLE, CONFIGURING, CONFIGURED, DRAINING, DELETING, FAILED, or DELETED)", bounded(q.State, 32))
		}
	}
	return nil
}

// historyDoc builds the JSON history of hs, the newest MaxEvents events
// at most.
func historyDoc(q HistoryQuery, now time.Time, hs []desired.MachineHistory) *jsonhistory.History {
	h := &jsonhistory.History{GeneratedAt: now.UTC(), Query: jsonhistory.Query{Machine: q.Machine, Zone: q.Zone, State: q.State}}
	if q.Since > 0 {
		s := now.Add(-q.Since).UTC()
		h.Query.Since = &s
	}
	total := 0
	for _, m := range hs {
		total += len(m.Events)
	}
	// Past the bound, the oldest events are left out.
	var cut time.Time
	if total > jsonhistory.MaxEvents {
		var ats []time.Time
		for _, m := range hs {
			for _, e := range m.Events {
				ats = append(ats, e.At)
			}
		}
		sort.Slice(ats, func(i, j int) bool { return ats[i].After(ats[j]) })
		cut = ats[jsonhistory.MaxEvents-1]
		h.Truncated = true
	}
	n := 0
	for _, m := range hs {
		jm := jsonhistory.Machine{ID: m.ID, Zone: m.Zone, State: m.State, Events: []jsonhistory.Event{}}
		if !m.Deleted.IsZero() {
			d := m.Deleted.UTC()
			jm.Deleted = &d
		}
		if jm.State == "" {
			jm.State = "DELETED"
		}
		for _, e := range m.Events {
			if e.At.Before(cut) || n >= jsonhistory.MaxEvents {
				continue
			}
			n++
			jm.Events = append(jm.Events, jsonhistory.Event{Seq: e.Seq, At: e.At.UTC(), Kind: e.Kind, From: e.From, To: e.To,
				OpID: e.OpID, Cause: e.Cause, Action: e.Action, Reason: e.Reason, DurationMS: e.DurationMS,
				Outcome: e.Outcome, Class: e.Class, Error: e.Error, Exit: e.Exit})
		}
		if q.Machine != "" || len(jm.Events) > 0 {
			h.Machines = append(h.Machines, jm)
		}
	}
	return h
}

// liveHistory answers q from a serving document (committed events only).
func liveHistory(doc *desired.Document, q HistoryQuery, now time.Time) *jsonhistory.History {
	if q.Machine != "" {
		var hs []desired.MachineHistory
		if m, ok := doc.History(q.Machine); ok {
			hs = append(hs, m)
		}
		return historyDoc(q, now, hs)
	}
	var since time.Time
	if q.Since > 0 {
		since = now.Add(-q.Since)
	}
	return historyDoc(q, now, doc.Histories(since, q.Zone, q.State))
}

// readStored reads the configured state read-only: what the leader
// committed on etcd, the journal's committed records on a file; nil
// without --state or for a file that does not exist.
func readStored(ctx context.Context, cfg *config.Config) (map[string][]byte, error) {
	switch {
	case cfg.Etcd != nil:
		client, err := etcdstore.NewClient(ctx, cfg.Etcd.Client())
		if err != nil {
			return nil, fmt.Errorf("--state %s: %w", cfg.StatePath, err)
		}
		defer client.Close()
		stored, err := etcdstore.ReadOnly(ctx, client, cfg.Etcd.Prefix, 0)
		if err != nil {
			return nil, fmt.Errorf("--state %s: %w", cfg.StatePath, err)
		}
		return stored, nil
	case cfg.StatePath != "":
		s, err := statefile.ReadOnly(cfg.StatePath)
		if errors.Is(err, fs.ErrNotExist) {
			return nil, nil
		}
		return s, err
	}
	return nil, nil
}

// OfflineHistory answers q from the state named by --state, read-only
// (nothing is written, no lock is taken, no hypervisor is contacted).
func OfflineHistory(ctx context.Context, cfg *config.Config, q HistoryQuery) (*jsonhistory.History, error) {
	if err := q.check(); err != nil {
		return nil, err
	}
	stored, err := readStored(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if len(stored) == 0 {
		return nil, fmt.Errorf("--state %s: no state there to read a history from", cfg.StatePath)
	}
	view, err := desired.Inspect(stored, docOptions(cfg, nil), nil)
	if err != nil {
		return nil, err
	}
	hists, err := desired.ReadHistory(stored)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	states := make(map[string]*desired.Machine, len(view.Machines))
	for _, m := range view.Machines {
		states[m.ID] = m
	}
	var since time.Time
	if q.Since > 0 {
		since = now.Add(-q.Since)
	}
	var hs []desired.MachineHistory
	for id, sh := range hists {
		if q.Machine != "" && id != q.Machine {
			continue
		}
		mh := desired.MachineHistory{ID: id, Zone: sh.Zone, State: "DELETED", Deleted: sh.Deleted}
		if m := states[id]; m != nil {
			mh.Zone, mh.State = m.Zone, m.State.String()
		}
		if q.Zone != "" && mh.Zone != q.Zone || q.State != "" && mh.State != q.State {
			continue
		}
		for _, e := range sh.Events {
			if !e.At.Before(since) {
				mh.Events = append(mh.Events, e)
			}
		}
		hs = append(hs, mh)
	}
	if q.Machine != "" && len(hs) == 0 {
		if m := states[q.Machine]; m != nil {
			hs = append(hs, desired.MachineHistory{ID: m.ID, Zone: m.Zone, State: m.State.String()})
		}
	}
	sort.Slice(hs, func(i, j int) bool { return hs[i].ID < hs[j].ID })
	return historyDoc(q, now, hs), nil
}

// debugHistory serves GET /debug/history?machine=ID, or
// ?since=10m&zone=Z&state=S for a fleet timeline, as the JSON history.
func (p *Provider) debugHistory(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		http.Error(w, "use GET", http.StatusMethodNotAllowed)
		return
	}
	v := r.URL.Query()
	q := HistoryQuery{Machine: v.Get("machine"), Zone: v.Get("zone"), State: v.Get("state")}
	if s := v.Get("since"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			http.Error(w, "since must be a duration, e.g. 10m", http.StatusBadRequest)
			return
		}
		q.Since = d
	}
	if err := q.check(); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	t := p.current()
	if t == nil {
		http.Error(w, "this replica is not serving the desired state", http.StatusServiceUnavailable)
		return
	}
	body, err := jsonhistory.Marshal(liveHistory(t.doc, q, time.Now()))
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write(body)
}

// maxHistoryBytes bounds a fetched history document.
const maxHistoryBytes = 64 << 20

// FetchHistory asks a running provider's metrics listener for q
// (GET /debug/history) and returns the decoded document and its JSON as
// served.
func FetchHistory(ctx context.Context, base string, q HistoryQuery, o FetchOptions) (*jsonhistory.History, []byte, error) {
	if err := q.check(); err != nil {
		return nil, nil, err
	}
	vals := url.Values{}
	if q.Machine != "" {
		vals.Set("machine", q.Machine)
	}
	if q.Since > 0 {
		vals.Set("since", q.Since.String())
	}
	if q.Zone != "" {
		vals.Set("zone", q.Zone)
	}
	if q.State != "" {
		vals.Set("state", q.State)
	}
	u := strings.TrimRight(base, "/") + "/debug/history?" + vals.Encode()
	if !strings.Contains(base, "://") {
		u = "http://" + u
	}
	client, err := fetchClient(o)
	if err != nil {
		return nil, nil, fmt.Errorf("fetch history: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, nil, fmt.Errorf("fetch history: %w", err)
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, nil, fmt.Errorf("fetch history: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxHistoryBytes+1))
	if err != nil {
		return nil, nil, fmt.Errorf("fetch history: %w", err)
	}
	if len(body) > maxHistoryBytes {
		return nil, nil, fmt.Errorf("fetch history: the document is larger than %d MiB", maxHistoryBytes>>20)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, nil, fmt.Errorf("fetch history: %s: %s", resp.Status, bounded(strings.TrimSpace(string(body)), 512))
	}
	h, err := jsonhistory.Decode(body)
	if err != nil {
		return nil, nil, fmt.Errorf("fetch history: %w", err)
	}
	return h, body, nil
}

// fetchClient is the HTTP client of FetchPlan and FetchHistory.
func fetchClient(o FetchOptions) (*http.Client, error) {
	if o.CAFile == "" {
		return http.DefaultClient, nil
	}
	pemBytes, err := conffile.Read(o.CAFile, conffile.MaxPEMBytes)
	if err != nil {
		return nil, fmt.Errorf("CA bundle: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pemBytes) {
		return nil, fmt.Errorf("CA bundle %s: no PEM certificate found", o.CAFile)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool}
	return &http.Client{Transport: tr}, nil
}
