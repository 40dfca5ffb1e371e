package proxmox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// resource is one entry of GET /cluster/resources, holding only the fields
// the adapter reads (the listing is the hot path of polling: fewer fields
// and exact tags decode faster than go-proxmox's ClusterResource).
type resource struct {
	Type     string `json:"type"`
	Node     string `json:"node"`
	VMID     uint64 `json:"vmid"`
	Name     string `json:"name"`
	Status   string `json:"status"`
	Tags     string `json:"tags"`
	Template uint64 `json:"template"`
	MaxMem   uint64 `json:"maxmem"`
	MaxCPU   uint64 `json:"maxcpu"`
	Pool     string `json:"pool"`
}

// listing is one answer of GET /cluster/resources (no type filter, so VMs
// and nodes come in one request).
type listing struct {
	// vms are the QEMU VMs and templates, in the API's order.
	vms []resource
	// nodes maps every cluster node the API lists to its status ("online",
	// "offline", "unknown").
	nodes map[string]string
	// at is when the request was sent (Config.Now): nothing older than at
	// is missing from it.
	at time.Time
}

// nodeOnline is the status PVE gives a node that is a quorate cluster
// member with fresh statistics.
const nodeOnline = "online"

// maxListingBytes bounds the body of one listing (about 330 bytes per VM:
// 64 MiB is some 200,000 VMs).
const maxListingBytes = 64 << 20

// fetch sends one GET /cluster/resources and decodes it. It does not use
// go-proxmox (whose Get reads the body, decodes it into a map, then again
// into 26-field structs): the poller runs it every PollInterval. The
// request goes through the same TLS-verifying transport and carries the
// same token; the caller holds listSem, which also guards buf.
func (a *Adapter) fetch(ctx context.Context) (*listing, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, a.resourcesURL, nil)
	if err != nil {
		return nil, fmt.Errorf("list cluster resources: %w", err)
	}
	req.Header.Set("Authorization", a.authHeader)
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", userAgent)
	a.calls.Add(1)
	res, err := a.hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("list cluster resources: %w", classify(err))
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		reason := strings.TrimSpace(strings.TrimPrefix(res.Status, strconv.Itoa(res.StatusCode)))
		if len(reason) > maxReason {
			reason = reason[:maxReason] + "..."
		}
		return nil, fmt.Errorf("list cluster resources: %w", classify(&StatusError{Code: res.StatusCode, Reason: reason}))
	}
	a.listBuf.Reset()
	if _, err := a.listBuf.ReadFrom(io.LimitReader(res.Body, maxListingBytes+1)); err != nil {
		return nil, fmt.Errorf("list cluster resources: read answer: %w", classify(err))
	}
	if a.listBuf.Len() > maxListingBytes {
		return nil, fmt.Errorf("list cluster resources: answer exceeds %d MiB", maxListingBytes>>20)
	}
	var body struct {
		Data []resource `json:"data"`
	}
	if err := json.Unmarshal(a.listBuf.Bytes(), &body); err != nil {
		return nil, fmt.Errorf("list cluster resources: decode answer: %w", err)
	}
	if body.Data == nil {
		// PVE always lists at least the answering node; null is no answer.
		return nil, errors.New("list cluster resources: the answer holds no data")
	}
	l := &listing{vms: body.Data[:0], nodes: map[string]string{}}
	for _, r := range body.Data {
		switch r.Type {
		case "qemu":
			l.vms = append(l.vms, r)
		case "node":
			l.nodes[r.Node] = r.Status
		}
	}
	// Drop what the filter left behind the kept entries, so the strings of
	// storage entries are not held by the cached listing.
	clear(body.Data[len(l.vms):])
	return l, nil
}

// list returns a cluster listing, reusing the last one if it is younger
// than ListingTTL and fresh is not set. Listings are serialised: a caller
// that waited for another's listing reuses it.
func (a *Adapter) list(ctx context.Context, fresh bool) (*listing, error) {
	if !fresh {
		if l := a.cachedListing(a.cfg.Now().Add(-a.cfg.ListingTTL)); l != nil {
			return l, nil
		}
	}
	if err := a.lockList(ctx); err != nil {
		return nil, fmt.Errorf("list cluster resources: %w", err)
	}
	defer a.unlockList()
	if !fresh {
		if l := a.cachedListing(a.cfg.Now().Add(-a.cfg.ListingTTL)); l != nil {
			return l, nil
		}
	}
	return a.fetchAndCache(ctx)
}

// lockList takes listSem, or fails when ctx ends first.
func (a *Adapter) lockList(ctx context.Context) error {
	select {
	case a.listSem <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctxErr(ctx)
	}
}

func (a *Adapter) unlockList() { <-a.listSem }

// fetchAndCache fetches a listing (listSem held) and caches it unless the
// adapter changed something while it was in flight: such a listing may
// predate the change and must not serve later Observe calls.
func (a *Adapter) fetchAndCache(ctx context.Context) (*listing, error) {
	a.cacheMu.Lock()
	gen := a.listGen
	a.cacheMu.Unlock()
	at := a.cfg.Now()
	l, err := a.fetch(ctx)
	if err != nil {
		return nil, err
	}
	l.at = at
	a.cacheMu.Lock()
	if a.listGen == gen {
		a.listing = l
	}
	a.cacheMu.Unlock()
	return l, nil
}

// cachedListing returns the cached listing if it was sent after since.
func (a *Adapter) cachedListing(since time.Time) *listing {
	a.cacheMu.Lock()
	defer a.cacheMu.Unlock()
	if a.listing != nil && a.listing.at.After(since) {
		return a.listing
	}
	return nil
}

// dropListing forgets the cached listing, so the next Observe asks the API.
func (a *Adapter) dropListing() {
	a.cacheMu.Lock()
	defer a.cacheMu.Unlock()
	a.listing = nil
}

// invalidate forgets the listing and marks a VM's config as changed by us.
func (a *Adapter) invalidate(vmid int) {
	a.cacheMu.Lock()
	defer a.cacheMu.Unlock()
	a.listing = nil
	a.listGen++
	if vmid != 0 {
		a.dirty[vmid] = true
	}
}
