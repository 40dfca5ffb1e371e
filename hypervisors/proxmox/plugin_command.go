package proxmox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/bigfleet-vm/provider/hypervisors/proxmox/pvesim"
	"github.com/bigfleet-vm/provider/plugin"
)

// Commands adds pve-sim to the provider binary.
func (pxPlugin) Commands() []plugin.Command {
	return []plugin.Command{{Name: "pve-sim", What: "serve the in-project Proxmox VE API simulator for demos", Run: pveSim}}
}

// pveSim serves the in-project Proxmox VE API simulator over HTTPS for
// demos: `provider pve-sim`, then run the provider against it with the
// printed flags.
func pveSim(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("pve-sim", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", "127.0.0.1:8006", "HTTPS listen address")
	nodes := fs.String("nodes", "pve1,pve2", "comma-separated node names")
	tokenID := fs.String("token-id", "bigfleet@pve!demo", "API token id accepted by the simulator")
	template := fs.Int("template-vmid", 9000, "VMID of the template created on the first node")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	var b [16]byte
	rand.Read(b[:])
	secret := hex.EncodeToString(b[:])
	nodeList := strings.Split(*nodes, ",")
	sim := pvesim.New(pvesim.Options{Nodes: nodeList})
	sim.AddToken(pvesim.Token{ID: *tokenID, Secret: secret, ACL: pvesim.FullAccess()})
	if err := sim.AddVM(pvesim.VMSpec{VMID: *template, Node: nodeList[0], Name: "bigfleet-template", Template: true, Cores: 2, MemoryMiB: 2048}); err != nil {
		fmt.Fprintln(stderr, "pve-sim:", err)
		return 1
	}
	host := strings.Split(*addr, ":")[0]
	cert, fp, err := pvesim.SelfSigned([]string{"localhost", host})
	if err != nil {
		fmt.Fprintln(stderr, "pve-sim:", err)
		return 1
	}
	fmt.Fprintf(stdout, "Proxmox VE API simulator on https://%s/api2/json (nodes %s, template %d)\n", *addr, *nodes, *template)
	fmt.Fprintf(stdout, "run the provider against it:\n  ./bin/provider --proxmox-api-url https://%s/api2/json --proxmox-token-id '%s' --proxmox-token-secret %s --proxmox-tls-fingerprint %s --nodes %s --template-vmid %d\n",
		*addr, *tokenID, secret, fp, *nodes, *template)
	errc := make(chan error, 1)
	go func() { errc <- sim.Serve(*addr, cert) }()
	select {
	case <-ctx.Done():
		return 0
	case err := <-errc:
		if err != nil && !errors.Is(err, http.ErrServerClosed) {
			fmt.Fprintln(stderr, "pve-sim:", err)
			return 1
		}
		return 0
	}
}
