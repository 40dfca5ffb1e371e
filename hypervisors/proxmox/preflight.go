package proxmox

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/hashicorp/go-multierror"
	pxapi "github.com/luthermonson/go-proxmox"

	"github.com/bigfleet-vm/provider/hypervisors"
)

// RequiredPrivileges returns, per ACL path, the privileges the token
// needs for the given PVE major version, pool, storage and templates.
// PVE 9 replaced VM.Monitor (agent access) with VM.GuestAgent.*.
func RequiredPrivileges(major int, pool, storage string, templates []int) map[string][]string {
	vmPath := "/vms"
	if pool != "" {
		vmPath = "/pool/" + pool // covers the pool's members, i.e. our clones
	}
	vm := []string{"VM.Allocate", "VM.Audit", "VM.Config.CPU", "VM.Config.Memory", "VM.Config.Options", "VM.PowerMgmt"}
	if major >= 9 {
		vm = append(vm, "VM.GuestAgent.Audit", "VM.GuestAgent.FileWrite", "VM.GuestAgent.Unrestricted")
	} else {
		vm = append(vm, "VM.Monitor")
	}
	out := map[string][]string{vmPath: vm}
	st := "/storage"
	if storage != "" {
		st = "/storage/" + storage
	}
	out[st] = []string{"Datastore.AllocateSpace"}
	for _, t := range templates {
		p := "/vms/" + strconv.Itoa(t)
		out[p] = append(out[p], "VM.Clone", "VM.Audit")
	}
	return out
}

// Preflight checks that the cluster can serve this configuration and
// reports every problem at once: the API answers (version), every node
// exists and is online, every template exists and is a template, the pool
// exists, and the token holds each needed privilege on its path.
func (a *Adapter) Preflight(ctx context.Context, templateVMIDs []int) error {
	var errs *multierror.Error
	ver, err := a.client.Version(ctx)
	if err != nil {
		return fmt.Errorf("preflight: read api version: %w", classify(err))
	}
	major, _ := strconv.Atoi(strings.SplitN(ver.Version, ".", 2)[0])

	nodes, err := a.client.Nodes(ctx)
	if err != nil {
		errs = multierror.Append(errs, fmt.Errorf("preflight: list nodes: %w", classify(err)))
	} else {
		have := map[string]string{}
		for _, n := range nodes {
			have[n.Node] = n.Status
		}
		for _, n := range a.cfg.Nodes {
			switch st, ok := have[n]; {
			case !ok:
				errs = multierror.Append(errs, fmt.Errorf("preflight: node %q does not exist in the cluster: %w", n, hypervisors.ErrNotFound))
			case st != "online":
				errs = multierror.Append(errs, fmt.Errorf("preflight: node %q is %s", n, st))
			}
		}
	}

	l, err := a.list(ctx, true)
	if err != nil {
		errs = multierror.Append(errs, fmt.Errorf("preflight: %w", err))
	} else {
		byID := map[int]resource{}
		for _, r := range l.vms {
			byID[int(r.VMID)] = r
		}
		for _, t := range templateVMIDs {
			switch r, ok := byID[t]; {
			case !ok:
				errs = multierror.Append(errs, fmt.Errorf("preflight: template vm %d does not exist (or is not visible to the token): %w", t, hypervisors.ErrNotFound))
			case r.Template != 1:
				errs = multierror.Append(errs, fmt.Errorf("preflight: vm %d (%s) is not a template: %w", t, r.Name, hypervisors.ErrInvalid))
			}
		}
	}

	if a.cfg.Pool != "" {
		if _, err := a.client.Pool(ctx, a.cfg.Pool); err != nil {
			errs = multierror.Append(errs, fmt.Errorf("preflight: pool %q: %w", a.cfg.Pool, classify(err)))
		}
	}

	need := RequiredPrivileges(major, a.cfg.Pool, a.cfg.Storage, templateVMIDs)
	paths := make([]string, 0, len(need))
	for p := range need {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	for _, p := range paths {
		perms, err := a.client.Permissions(ctx, &pxapi.PermissionsOptions{Path: p})
		if err != nil {
			errs = multierror.Append(errs, fmt.Errorf("preflight: read permissions on %s: %w", p, classify(err)))
			continue
		}
		have := perms[p]
		for _, priv := range need[p] {
			if !bool(have[priv]) {
				errs = multierror.Append(errs, fmt.Errorf("preflight: token %s lacks privilege %s on %s: %w",
					a.cfg.TokenID, priv, p, hypervisors.ErrPermission))
			}
		}
	}
	return errs.ErrorOrNil()
}
